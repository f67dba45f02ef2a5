"""Scoped tokens, reads off loopback, rate limits and the audit log, through the hub's real app."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.cli import main
from gpuscope.config import ConfigError, load_config
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi
from gpuscope.web.auth import AuditLog, AuthSettings, digest, parse_auth
from gpuscope.web.guard import PUBLIC, ROUTE_SCOPES, required_scope

INGEST_T = "ingest-token-0123456789"
READ_T = "read-token-0123456789abc"
ADMIN_T = "admin-token-0123456789ab"


def settings(**extra: Any) -> AuthSettings:
    return parse_auth(
        {
            "tokens": [
                {"name": "agents", "scopes": ["ingest"], "sha256": digest(INGEST_T).hex()},
                {"name": "grafana", "scopes": ["read"], "token": READ_T},
                {"name": "ops", "scopes": ["admin", "read"], "sha256": digest(ADMIN_T).hex()},
            ],
            **extra,
        }
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def batch(k: int = 0) -> bytes:
    frame = {"ts": 900.0 + k, "metrics": ["gpu_temp_celsius"], "entities": [{"node": "n", "gpu": "0"}]}
    return orjson.dumps({"source": "n", "batch_id": f"b{k}", "frames": [{**frame, "values": [[60.0]]}]})


class Rig:
    def __init__(self, auth: AuthSettings, open_reads: bool, audit: AuditLog | None = None) -> None:
        self.hub = Hub(DuckDBStore(":memory:", durable=False))
        self.alerting = AlertingService(self.hub, parse_alerting({}))
        self.api = HubApi(
            self.hub,
            auth=auth,
            open_reads=open_reads,
            audit=audit,
            clock=lambda: 1000.0,
            alerting=self.alerting,
        )
        self.client = TestClient(self.api.app)

    def ingest(self, headers: dict[str, str]) -> Any:
        return self.client.post(
            "/api/v1/ingest", content=batch(), headers={**headers, "content-type": "application/json"}
        )

    def close(self) -> None:
        self.alerting.stop()
        self.hub.store.close()


@pytest.fixture
def off_loopback() -> Iterator[Rig]:
    rig = Rig(settings(), open_reads=False)
    yield rig
    rig.close()


def test_each_scope_opens_only_its_routes(off_loopback: Rig) -> None:
    rig, c = off_loopback, off_loopback.client
    assert rig.ingest(bearer(INGEST_T)).status_code == 200
    refused = rig.ingest(bearer(READ_T))
    assert refused.status_code == 403 and "'ingest'" in refused.json()["error"]
    assert "grafana" in refused.json()["error"] and READ_T not in refused.text

    assert c.get("/api/v1/alerts", headers=bearer(READ_T)).status_code == 200
    assert c.get("/api/v1/ui/fleet", headers=bearer(READ_T)).status_code == 200
    r = c.get("/api/v1/alerts", headers=bearer(INGEST_T))
    assert r.status_code == 403 and "'read'" in r.json()["error"]

    silence = {"matchers": ["node=n"], "duration": "1h", "created_by": "alice"}
    r = c.post("/api/v1/silences", json=silence, headers=bearer(READ_T))
    assert r.status_code == 403 and "'admin'" in r.json()["error"]
    assert c.post("/api/v1/silences", json=silence, headers=bearer(ADMIN_T)).status_code == 201
    r = c.post("/api/v1/lineage/runs", json={"job": "j"}, headers=bearer(INGEST_T))
    assert r.status_code == 403 and "'admin'" in r.json()["error"]


def test_reads_off_loopback_need_a_token_but_the_page_loads(off_loopback: Rig) -> None:
    c = off_loopback.client
    for path in ("/api/v1/alerts", "/api/v1/health", "/api/v1/ui/fleet", "/api/v1/lineage/deployments"):
        r = c.get(path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"] == "Bearer" and r.json()["field"] == "authorization"
    assert c.get("/ui/").status_code == 200  # the page asks for the token, then reads with it
    assert c.get("/ui/static/app.js").status_code == 200
    assert c.get("/openapi.json").status_code == 200
    r = c.get("/api/v1/alerts", headers=bearer("not-a-known-token-at-all"))
    assert r.status_code == 403 and r.json()["error"] == "the token is not valid"
    assert c.get("/api/v1/alerts", headers={"Authorization": f"Basic {READ_T}"}).status_code == 403


def test_loopback_reads_stay_open_unless_required() -> None:
    rig = Rig(settings(), open_reads=True)
    try:
        assert rig.client.get("/api/v1/alerts").status_code == 200
        assert rig.ingest({}).status_code == 401  # writes always need their scope
        assert rig.client.post("/api/v1/silences", json={"matchers": ["a=b"]}).status_code == 401
    finally:
        rig.close()
    strict = Rig(settings(require_read_token=True), open_reads=True)
    try:
        assert strict.client.get("/api/v1/alerts").status_code == 401
        assert strict.client.get("/api/v1/alerts", headers=bearer(READ_T)).status_code == 200
    finally:
        strict.close()


def test_every_route_declares_a_scope_and_openapi_says_which(off_loopback: Rig) -> None:
    app = off_loopback.api.app
    mounted = {
        (method, str(getattr(route, "path", "")))
        for route in app.routes
        for method in (getattr(route, "methods", None) or {"GET"}) - {"HEAD"}
    }
    for method, path in mounted:
        need = required_scope(method, path)
        if path.startswith("/api/"):
            assert need in {"ingest", "read", "admin"}, (method, path)
        if path.startswith("/prometheus/api/v1/"):  # Prometheus clients POST their queries: reads
            assert need == "read", (method, path)
        elif method not in {"GET", "HEAD"}:
            assert need in {"ingest", "admin"}, (method, path)  # no write is ever public or read-only
    assert required_scope("POST", "/api/v1/some/future/write") == "admin"
    assert required_scope("GET", "/api/v1/audit") == "admin"
    declared_api = {k for k, v in ROUTE_SCOPES.items() if v != PUBLIC and k[1] != "/api/v1/cluster/forward"}
    assert declared_api <= mounted, "ROUTE_SCOPES names a route that does not exist"

    doc = off_loopback.client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    ops = doc["paths"]
    assert ops["/api/v1/ingest"]["post"]["x-required-scope"] == "ingest"
    assert ops["/api/v1/silences"]["post"]["x-required-scope"] == "admin"
    assert ops["/api/v1/series"]["get"]["x-required-scope"] == "read"
    assert ops["/api/v1/audit"]["get"]["x-required-scope"] == "admin"
    assert ops["/openapi.json"]["get"]["security"] == []
    assert "429" in ops["/api/v1/ingest"]["post"]["responses"]


def test_rate_limits_per_token_answer_429_with_retry_after() -> None:
    limits = {"read": {"rate": 0.5, "burst": 2}, "anonymous": {"rate": 0.5, "burst": 1}}
    rig = Rig(settings(rate_limits=limits), open_reads=True)
    try:
        c = rig.client
        assert [c.get("/api/v1/alerts", headers=bearer(READ_T)).status_code for _ in range(2)] == [200, 200]
        r = c.get("/api/v1/alerts", headers=bearer(READ_T))
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert "grafana" in r.json()["error"] and READ_T not in r.text
        # other tokens and unauthenticated loopback reads have buckets of their own
        assert c.get("/api/v1/alerts", headers=bearer(ADMIN_T)).status_code == 200
        assert c.get("/api/v1/alerts").status_code == 200
        assert c.get("/api/v1/alerts").status_code == 429
        assert rig.ingest(bearer(INGEST_T)).status_code == 200  # no ingest limit configured
        counters = c.get("/api/v1/health", headers=bearer(ADMIN_T)).json()["counters"]
        assert counters["rate_limited.grafana"] == 1 and counters["rate_limited.anonymous"] == 1
    finally:
        rig.close()


def test_admin_writes_are_audited_durably(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "audit.jsonl"
    rig = Rig(settings(), open_reads=False, audit=AuditLog(str(path)))
    try:
        c, admin = rig.client, bearer(ADMIN_T)
        sid = c.post("/api/v1/silences", json={"matchers": ["node=n"], "created_by": "a"}, headers=admin)
        assert sid.status_code == 201
        assert c.delete(f"/api/v1/silences/{sid.json()['id']}", headers=admin).status_code == 200
        assert c.post("/api/v1/alerts/al-404/ack", json={"by": "bob"}, headers=admin).status_code == 404
        assert c.post("/api/v1/lineage/runs", json={"job": "llm"}, headers=admin).status_code == 200
        c.post("/api/v1/silences", json={"matchers": ["a=b"]}, headers=bearer(READ_T))  # refused: not audited
        c.get("/api/v1/alerts", headers=admin)  # reads are not audited

        assert c.get("/api/v1/audit", headers=bearer(READ_T)).status_code == 403
        entries = c.get("/api/v1/audit", headers=admin).json()["entries"]
        assert [e["action"] for e in entries] == [
            "POST /api/v1/lineage/runs",
            "POST /api/v1/alerts/{id}/ack",
            "DELETE /api/v1/silences/{id}",
            "POST /api/v1/silences",
        ]
        assert {e["token"] for e in entries} == {"ops"} and entries[1]["target"] == {"id": "al-404"}
        assert entries[1]["status"] == 404 and entries[0]["source"].startswith("testclient")
        text = path.read_text()
        assert ADMIN_T not in text and digest(ADMIN_T).hex() not in text
        assert [orjson.loads(line)["action"] for line in text.splitlines()] == [
            e["action"] for e in reversed(entries)
        ]
        assert AuditLog(str(path)).entries() == entries  # read back after a restart
    finally:
        rig.close()


def test_token_create_prints_a_token_that_its_config_line_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    assert main(["token", "create", "--name", "agents", "--scopes", "ingest,read"]) == 0
    out = capsys.readouterr().out.splitlines()
    token = out[0].rsplit(" ", 1)[1]
    assert token not in "\n".join(out[1:])
    config = tmp_path / "hub.yaml"
    config.write_text("auth:\n  tokens:\n" + out[2] + "\n")
    cfg = load_config(config)
    match = cfg.auth.match(token)
    assert match is not None and match.name == "agents" and match.scopes == {"ingest", "read"}
    assert cfg.auth.match(token + "x") is None and cfg.tokens == []
    assert main(["token", "create", "--name", "x", "--scopes", "root"]) == 2
    assert "'root' is not a scope" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ("{tokens: [{name: a, scopes: [superuser], token: 0123456789abcdef0}]}", "auth.tokens[0].scopes"),
        ("{tokens: [{name: a, scopes: [read]}]}", "auth.tokens[0]: give exactly one"),
        ("{tokens: [{name: a, scopes: [read], sha256: abc}]}", "auth.tokens[0].sha256"),
        (
            "{tokens: [{name: a, scopes: [read], token: 0123456789abcdef0}, {name: a, scopes: [read], "
            "token: 0123456789abcdef1}]}",
            "'a' is used twice",
        ),
        ("{rate_limits: {write: {rate: 1}}}", "auth.rate_limits: unknown key 'write'"),
        ("{rate_limits: {read: {rate: 0}}}", "auth.rate_limits.read.rate"),
        ("{rate_limits: {tokens: {nobody: {rate: 1}}}}", "auth.rate_limits.tokens.nobody"),
        ("{require_read_token: 'yes'}", "auth.require_read_token"),
        ("{tokens: [short]}", "auth.tokens[0]"),
    ],
)
def test_bad_auth_config_names_the_field(tmp_path: Path, auth: str, field: str) -> None:
    config = tmp_path / "hub.yaml"
    config.write_text(f"auth: {auth}\n")
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_config(config)


def test_plain_tokens_and_the_environment_keep_every_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCOPE_TOKEN", "from-the-environment-123")
    config = tmp_path / "hub.yaml"
    config.write_text("auth: {tokens: ['a-legacy-plain-token-0123']}\n")
    cfg = load_config(config)
    names = {t.name: t.scopes for t in cfg.auth.tokens}
    assert names == {"env": {"ingest", "read", "admin"}, "token-1": {"ingest", "read", "admin"}}
    assert cfg.tokens == ["from-the-environment-123", "a-legacy-plain-token-0123"]
