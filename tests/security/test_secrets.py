"""No secret in logs, error bodies, health or ``repr``: secrets are planted in the config and the
requests, the main flows run for real, and everything captured is searched for them."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import httpx
import pytest

from alert.rig import Scripted, lost
from alert.sink import Sink
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.cli import main
from gpuscope.config import load_config
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.redact import RedactingFilter, secret_strings
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import free_port

TOKEN = "planted-hub-token-3f9a7c1e"
WRONG = "planted-wrong-token-b81d44"
HOOK_PATH = "/hook/planted-webhook-secret-9e2b"
ROUTING_KEY = "planted-routing-key-51ac0d"
DSN_PASSWORD = "planted-dsn-password-77e1"
PEER_TOKEN = "planted-peer-token-0c4f19"
SECRETS = (TOKEN, WRONG, HOOK_PATH, ROUTING_KEY, DSN_PASSWORD, PEER_TOKEN)


def leaks(*texts: str) -> list[str]:
    return [s for s in SECRETS if any(s in t for t in texts)]


def test_bad_tokens_notifier_failures_and_health_leak_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    failing = Sink(status=500)  # a receiver that fails: retried, and logged
    closed = free_port()  # a receiver nobody listens on
    hub = Hub(DuckDBStore(":memory:", durable=False))
    script = Scripted()
    hub.detection = DetectionEngine([script])
    receivers = [
        {"name": "hook", "webhook": {"url": f"{failing.url}{HOOK_PATH}"}},
        {"name": "pager", "pagerduty": {"routing_key": ROUTING_KEY, "url": f"http://127.0.0.1:{closed}/x"}},
    ]
    service = AlertingService(hub, parse_alerting({"receivers": receivers}))
    server = HubServer(hub, "127.0.0.1", 0, tokens=[TOKEN], evaluate_interval=0.1, alerting=service)
    service.start()
    server.start()
    answers: list[str] = []
    try:
        script.findings = [lost()]
        deadline = time.monotonic() + 15
        while hub.counters.get("notification_retries") < 2:
            assert time.monotonic() < deadline, "the receivers were never tried"
            time.sleep(0.05)
        for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": WRONG}):
            r = httpx.post(f"{server.url}/api/v1/silences", json={"matchers": ["a=b"]}, headers=headers)
            assert r.status_code in (401, 403)
            answers.append(r.text + str(r.headers))
        good = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/api/v1/health", "/api/v1/alerting/status", "/api/v1/alerting/alerts", "/api/v1/audit"):
            r = httpx.get(server.url + path, headers=good)
            assert r.status_code == 200, path
            answers.append(r.text)
        alert_id = httpx.get(server.url + "/api/v1/alerting/alerts").json()["alerts"][0]["id"]
        answers.append(httpx.get(f"{server.url}/api/v1/alerts/{alert_id}/history").text)
    finally:
        server.stop()
        service.stop()
        failing.down()
    assert hub.counters.get("auth_refused_401") == 1 and hub.counters.get("auth_refused_403") == 2
    assert not leaks(caplog.text, *answers, repr(server.api.auth), repr(service.settings))


def test_config_errors_and_repr_leak_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = tmp_path / "hub.yaml"
    good = (
        f"auth: {{tokens: ['{TOKEN}']}}\n"
        f"state: {{postgres_dsn: 'postgresql://gpuscope:{DSN_PASSWORD}@db.example/gpuscope'}}\n"
        f"cluster: {{peer_token: {PEER_TOKEN}}}\n"
        f"receivers:\n  - {{name: pager, pagerduty: {{routing_key: {ROUTING_KEY}}}}}\n"
    )
    config.write_text(good)
    cfg = load_config(config)
    assert not leaks(repr(cfg), str(cfg))
    assert set(SECRETS) - {WRONG, HOOK_PATH} <= set(secret_strings(cfg.tokens, cfg.raw))

    # a cluster database that cannot be reached: a clear refusal, the DSN's password not in it
    listen = f"127.0.0.1:{free_port()}"
    assert main(["hub", "--config", str(config), "--db", str(tmp_path / "c.duckdb"), "--listen", listen]) == 2
    out = capsys.readouterr()
    assert "cannot use the cluster database (cluster.postgres_dsn)" in out.err
    assert not leaks(out.out, out.err, caplog.text)

    # a receiver URL with a wrong scheme, as a user might paste it: the error names the key only
    single = "\n".join(line for line in good.splitlines() if not line.startswith(("state:", "cluster:")))
    config.write_text(single + f"\n  - {{name: hook, webhook: {{url: 'ftp://h.example{HOOK_PATH}'}}}}\n")
    assert main(["hub", "--config", str(config), "--db", str(tmp_path / "h.duckdb"), "--listen", listen]) == 2
    out = capsys.readouterr()
    # the console wraps a long message (the config file's path now leads it)
    assert "webhook.url must be an http(s) URL" in " ".join(out.err.split())
    assert not leaks(out.out, out.err, caplog.text)


def test_the_log_filter_redacts_what_slips_through() -> None:
    flt = RedactingFilter([TOKEN, HOOK_PATH])
    args = (HOOK_PATH, TOKEN)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "posting to %s with %s", args, None)
    try:
        raise RuntimeError(f"failed: {HOOK_PATH}")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert flt.filter(record)
    text = logging.Formatter().format(record)
    assert "posting to *** with ***" in text and "failed: ***" in text and not leaks(text)
