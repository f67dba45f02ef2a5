"""The hub's HTTP API in process: ingest, queries, auth, limits and refusals that name the field."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_TYPE
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.payload import Limits, parse_batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi
from gpuscope.web.server import HubServer, is_loopback

TOKEN = "a-test-token-of-some-length"


def make_client(
    tokens: list[str] | None = None, limits: Limits | None = None, max_entities: int = 1000
) -> tuple[TestClient, Hub]:
    hub = Hub(DuckDBStore(":memory:", max_entities=max_entities))
    api = HubApi(hub, tokens=tokens, limits=limits, clock=lambda: 1000.0)
    return TestClient(api.app), hub


@pytest.fixture
def client() -> Iterator[TestClient]:
    c, hub = make_client()
    yield c
    hub.store.close()


def batch(k: int = 0, node: str = "node-0", gpus: int = 2) -> dict[str, Any]:
    return {
        "source": node,
        "batch_id": f"{node}-{k}",
        "frames": [
            {
                "ts": 900.0 + k,
                "metrics": ["gpu_utilization_percent", "gpu_temp_celsius"],
                "entities": [{"node": node, "gpu": str(g), "job": "train"} for g in range(gpus)],
                "values": [[90.0 + g, 60.0 + k] for g in range(gpus)],
            }
        ],
        "events": [
            {"ts": 900.0 + k, "kind": "xid", "labels": {"node": node, "gpu": "1"}, "data": {"code": 13}}
        ],
        "training": [
            {
                "ts": 900.0 + k,
                "job": "train",
                "rank": 0,
                "step": k,
                "metrics": {"loss": 2.0 - k / 10},
                "labels": {"node": node, "gpu": "0"},
            }
        ],
    }


def post(client: TestClient, body: Any, headers: dict[str, str] | None = None) -> Any:
    return client.post(
        "/api/v1/ingest",
        content=orjson.dumps(body),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def test_ingest_then_query(client: TestClient) -> None:
    for k in range(5):
        r = post(client, batch(k))
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == {"samples": 4, "events": 1, "training": 1}
    series = client.get(
        "/api/v1/series",
        params={
            "metric": "gpu_temp_celsius",
            "node": "node-0",
            "gpu": "1",
            "start": 890,
            "end": 910,
            "points": 100,
        },
    ).json()
    assert [p[1] for p in series["points"]] == [60.0, 61.0, 62.0, 63.0, 64.0]
    snap = client.get("/api/v1/snapshot", params={"metrics": "gpu_temp_celsius"}).json()["entities"]
    assert {r["labels"]["gpu"]: r["values"]["gpu_temp_celsius"] for r in snap} == {"0": 64.0, "1": 64.0}
    agg = client.get(
        "/api/v1/aggregate",
        params={"metric": "gpu_utilization_percent", "by": "node", "start": 0, "end": 2000},
    ).json()["groups"]
    assert agg[0]["group"] == "node-0" and agg[0]["count"] == 10 and agg[0]["mean"] == pytest.approx(90.5)
    events = client.get("/api/v1/events", params={"kind": "xid", "start": 0, "end": 2000}).json()["events"]
    assert len(events) == 5 and events[0]["data"] == {"code": 13}
    training = client.get("/api/v1/training", params={"job": "train", "start": 0, "end": 2000}).json()
    assert [r["step"] for r in training["records"]] == [0, 1, 2, 3, 4]
    health = client.get("/api/v1/health").json()
    assert health["status"] == "ok" and health["counters"]["ingest_samples"] == 20


def test_retried_batch_is_stored_once(client: TestClient) -> None:
    assert post(client, batch(1)).json()["duplicate"] is False
    assert post(client, batch(1)).json()["duplicate"] is True
    events = client.get("/api/v1/events", params={"kind": "xid", "start": 0, "end": 2000}).json()["events"]
    assert len(events) == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (orjson.dumps([1]), 400, "body"),
        (orjson.dumps({"frames": []}), 400, "source"),
        (
            orjson.dumps(
                {"source": "x", "frames": [{"ts": 1, "metrics": ["a"], "entities": [{}], "values": [["x"]]}]}
            ),
            400,
            "frames[0].values[0][0]",
        ),
    ],
)
def test_bad_bodies_name_the_field(client: TestClient, body: bytes, status: int, field: str) -> None:
    r = client.post("/api/v1/ingest", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    assert r.json()["field"] == field


def test_binary_frames_are_ingested_like_json_and_refused_by_field(client: TestClient) -> None:
    def send(body: bytes) -> Any:
        return client.post("/api/v1/ingest", content=body, headers={"Content-Type": FRAME_TYPE})

    for k in range(3):
        r = send(encode_frame(parse_batch(batch(k))))
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == {"samples": 4, "events": 1, "training": 1}
    assert send(encode_frame(parse_batch(batch(2)))).json()["duplicate"] is True
    assert post(client, batch(3)).status_code == 200  # JSON stays accepted beside frames
    series = client.get(
        "/api/v1/series",
        params={"metric": "gpu_temp_celsius", "gpu": "1", "start": 890, "end": 910, "points": 100},
    ).json()
    assert [p[1] for p in series["points"]] == [60.0, 61.0, 62.0, 63.0]
    body = encode_frame(parse_batch(batch(4)))
    r = send(body[:-30])
    assert r.status_code == 400 and r.json()["field"] == "extras" and "ends at byte" in r.json()["error"]
    r = send(encode_frame(parse_batch({**batch(5), "source": "node-0", "frames": [], "events": []}))[:9])
    assert r.status_code == 400 and r.json()["field"] == "source"


def test_bad_input_loses_nothing_accepted(client: TestClient) -> None:
    post(client, batch(0))
    post(client, {"source": "x", "frames": "nope"})
    post(client, batch(1))
    assert client.get("/api/v1/health").json()["counters"]["ingest_rejected_batches"] == 1
    series = client.get(
        "/api/v1/series",
        params={"metric": "gpu_temp_celsius", "gpu": "0", "start": 890, "end": 910, "points": 100},
    ).json()
    assert len(series["points"]) == 2


def test_content_type_and_size_limits() -> None:
    client, hub = make_client(limits=Limits(max_body_bytes=1000))
    r = client.post("/api/v1/ingest", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["field"] == "content-type"
    r = post(client, {"source": "x" * 2000})
    assert r.status_code == 413 and r.json()["field"] == "body"
    assert hub.counters.get("ingest_refused_too_large") == 1
    hub.store.close()


def test_cardinality_limit_refuses_new_entities_keeps_known() -> None:
    client, hub = make_client(max_entities=2)
    assert post(client, batch(0, gpus=2)).status_code == 200
    r = post(client, batch(1, gpus=4)).json()
    assert r["refused"]["entities"] == 2 and r["refused"]["samples"] == 4
    assert r["accepted"]["samples"] == 4
    assert hub.counters.get("ingest_refused_samples") == 4
    hub.store.close()


def test_writes_need_the_token() -> None:
    client, hub = make_client(tokens=[TOKEN])
    assert post(client, batch(0)).status_code == 401
    r = post(client, batch(0), {"Authorization": "Bearer wrong-token-xxxxxxxxxx"})
    assert r.status_code == 403 and r.json()["field"] == "authorization"
    assert post(client, batch(0), {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/api/v1/health").status_code == 200
    hub.store.close()


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/api/v1/series", {}, "metric"),
        ("/api/v1/series", {"metric": "m", "start": "yesterday"}, "start"),
        ("/api/v1/series", {"metric": "m", "start": "10", "end": "5"}, "start"),
        ("/api/v1/series", {"metric": "m", "points": "0"}, "points"),
        ("/api/v1/series", {"metric": "m", "end": "inf"}, "end"),
        ("/api/v1/aggregate", {"metric": "m"}, "by"),
        ("/api/v1/training", {}, "job"),
        ("/api/v1/training", {"job": "j", "rank": "-1"}, "rank"),
        ("/api/v1/alerts", {"state": "maybe"}, "state"),
        ("/api/v1/events", {"limit": "many"}, "limit"),
    ],
)
def test_bad_queries_name_the_parameter(
    client: TestClient, path: str, params: dict[str, str], field: str
) -> None:
    r = client.get(path, params=params)
    assert r.status_code == 400
    assert r.json()["field"] == field


def test_alerts_and_incidents_after_evaluation() -> None:
    client, hub = make_client()
    body = batch(0)
    body["events"] = [
        {
            "ts": 900.0,
            "kind": "xid",
            "labels": {"node": "node-0", "gpu": "1"},
            "data": {"code": 79, "message": "GPU has fallen off the bus"},
        }
    ]
    post(client, body)
    assert client.get("/api/v1/alerts").json()["alerts"] == []
    hub.evaluate(901.0)
    alerts = client.get("/api/v1/alerts").json()["alerts"]
    assert [(a["rule"], a["severity"], a["entity"]) for a in alerts] == [
        ("gpu_xid_fatal", "P1", {"node": "node-0", "gpu": "1"})
    ]
    assert alerts[0]["cost_per_hour"] > 0
    incidents = client.get("/api/v1/incidents").json()["incidents"]
    assert len(incidents) == 1 and incidents[0]["root"] == alerts[0]["id"]
    hub.store.close()


def test_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {
        "/api/v1/ingest",
        "/api/v1/series",
        "/api/v1/snapshot",
        "/api/v1/alerts",
        "/api/v1/health",
    } <= set(doc["paths"])


def test_non_loopback_bind_needs_a_token() -> None:
    hub = Hub(DuckDBStore(":memory:"))
    with pytest.raises(ValueError, match="without an auth token"):
        HubServer(hub, "0.0.0.0", 0)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1")
    hub.store.close()


def test_openapi_documents_every_api_route(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()["paths"]
    app = client.app
    mounted = {
        (route.path.replace(":path}", "}"), method.lower())  # a converter is not part of the template
        for route in app.routes  # type: ignore[attr-defined]
        if getattr(route, "path", "").startswith("/api/")
        for method in (getattr(route, "methods", None) or ()) - {"HEAD"}
    }
    missing = sorted(f"{m.upper()} {p}" for p, m in mounted if m not in doc.get(p, {}))
    assert not missing, f"routes missing from /openapi.json: {missing}"
