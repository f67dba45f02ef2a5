"""POST /api/v1/ingest as a plain ASGI app: the same answers, limits and counters as a handler."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient
from starlette.types import Message

from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_TYPE
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.payload import Limits, parse_batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi
from gpuscope.web.auth import INGEST, READ, AuthSettings, RateLimit, Token, digest
from gpuscope.web.guard import PRINCIPAL_KEY
from gpuscope.web.ingest_route import IngestRoute

NOW = 1000.0


def doc(node: str = "node-0", k: int = 0) -> dict[str, Any]:
    return {
        "source": node,
        "batch_id": f"{node}-{k}",
        "frames": [
            {
                "ts": 990.0 + k,
                "metrics": ["gpu_utilization_percent"],
                "entities": [{"node": node, "gpu": "0"}],
                "values": [[50.0 + k]],
            }
        ],
    }


@pytest.fixture
def hub() -> Iterator[Hub]:
    h = Hub(DuckDBStore(":memory:"))
    yield h
    h.store.close()


def call(
    route: IngestRoute, chunks: list[Message], headers: list[tuple[bytes, bytes]], authorised: bool = True
) -> tuple[int, dict[bytes, bytes], Any]:
    """One request straight through the ASGI app: its status, headers and JSON answer."""
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/api/v1/ingest", "headers": headers}
    if authorised:
        scope[PRINCIPAL_KEY] = object()
    queue = list(chunks)
    sent: list[Message] = []

    async def receive() -> Message:
        return queue.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(route(scope, receive, send))
    start, body = sent
    return start["status"], dict(start["headers"]), orjson.loads(body["body"])


def test_a_body_in_pieces_is_joined_and_stored(hub: Hub) -> None:
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    raw = orjson.dumps(doc())
    pieces = [raw[:10], raw[10:10], raw[10:]]
    chunks: list[Message] = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)
    ]
    status, headers, answer = call(route, chunks, [(b"content-type", b"application/json")])
    assert status == 200 and answer["accepted"]["samples"] == 1 and not answer["duplicate"]
    assert headers == {
        b"content-length": str(len(orjson.dumps(answer))).encode(),
        b"content-type": b"application/json",
    }
    assert hub.counters.get("ingest_batches") == 1


def test_a_body_past_the_limit_in_pieces_without_a_length_is_refused_and_counted(hub: Hub) -> None:
    route = IngestRoute(hub, Limits(max_body_bytes=100), clock=lambda: NOW)
    chunks: list[Message] = [{"type": "http.request", "body": b" " * 60, "more_body": True}] * 2
    status, headers, answer = call(route, chunks, [(b"content-type", b"application/json")])
    assert (status, answer["field"]) == (413, "body")
    assert headers[b"content-type"] == b"application/json"
    assert hub.counters.get("ingest_refused_too_large") == 1 and hub.counters.get("api_refused_413") == 1
    assert hub.overload.status(NOW)["in_flight"] == 0  # the admission is given back


def test_a_sender_gone_mid_body_stores_nothing_and_is_counted(hub: Hub) -> None:
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    raw = orjson.dumps(doc())
    chunks: list[Message] = [
        {"type": "http.request", "body": raw[:20], "more_body": True},
        {"type": "http.disconnect"},
    ]
    status, _, answer = call(route, chunks, [(b"content-type", b"application/json")])
    assert (status, answer["field"]) == (499, "body")
    assert hub.counters.get("ingest_client_disconnects") == 1 and hub.counters.get("ingest_batches") == 0


def test_reached_without_the_auth_middleware_it_refuses_to_write(hub: Hub) -> None:
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    chunks: list[Message] = [{"type": "http.request", "body": orjson.dumps(doc())}]
    status, _, answer = call(route, chunks, [(b"content-type", b"application/json")], authorised=False)
    assert (status, answer["field"]) == (401, "authorization")
    assert hub.counters.get("ingest_batches") == 0


@pytest.mark.parametrize(
    ("content_type", "status"),
    [(None, 200), ("application/json; charset=utf-8", 200), ("", 415), ("text/plain", 415)],
)
def test_the_content_type_defaults_to_json_and_parameters_are_ignored(
    hub: Hub, content_type: str | None, status: int
) -> None:
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    got, _, answer = call(route, [{"type": "http.request", "body": orjson.dumps(doc())}], headers)
    assert got == status
    if status == 415:
        assert answer["field"] == "content-type"


def test_over_http_frames_and_json_give_the_same_answer_and_a_field_named_refusal(hub: Hub) -> None:
    client = TestClient(HubApi(hub, clock=lambda: NOW).app)
    as_json = client.post(
        "/api/v1/ingest", content=orjson.dumps(doc(k=0)), headers={"Content-Type": "application/json"}
    )
    frame = encode_frame(parse_batch(doc(k=1), Limits()))
    as_frame = client.post("/api/v1/ingest", content=frame, headers={"Content-Type": FRAME_TYPE})
    assert as_json.status_code == as_frame.status_code == 200
    assert as_json.json() == as_frame.json()
    assert as_frame.headers["content-type"] == "application/json"
    bad = client.post("/api/v1/ingest", content=frame[:-3], headers={"Content-Type": FRAME_TYPE})
    assert bad.status_code == 400 and bad.json()["field"]
    assert hub.counters.get("api_refused_400") == 1 and hub.counters.get("ingest_rejected_batches") == 1
    # other methods on the route still get the router's answer, naming the method
    assert client.get("/api/v1/ingest").json()["field"] == "method"


def test_on_the_ingest_log_a_batch_is_answered_durable_without_a_worker_thread(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "hub.duckdb"))
    hub = Hub(store)
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    route._pool.shutdown()  # the event loop writes the record and awaits the log's own sync
    status, _, answer = call(route, [{"type": "http.request", "body": orjson.dumps(doc())}], [])
    assert status == 200 and answer["accepted"]["samples"] == 1
    assert store._log is not None and store._log.synced == 1  # synced before the answer
    assert hub.unsettled()  # queued for the detectors once durable
    assert hub.counters.get("ingest_batches") == 1
    # a retry is a duplicate while its first copy is only in the log
    status, _, answer = call(route, [{"type": "http.request", "body": orjson.dumps(doc())}], [])
    assert status == 200 and answer["duplicate"] is True
    store.close()
    reopened = DuckDBStore(str(tmp_path / "hub.duckdb"))
    assert [p.value for p in reopened.series("gpu_utilization_percent", {"node": "node-0"}, 0, 2000)] == [
        50.0
    ]
    reopened.close()


def test_the_served_app_takes_ingest_first_behind_the_same_front_door_and_rate_limits(hub: Hub) -> None:
    agent, reader = "agent-token-" + "a" * 32, "reader-token-" + "r" * 32
    auth = AuthSettings(
        [
            Token("agents", frozenset({INGEST}), digest(agent)),
            Token("reader", frozenset({READ}), digest(reader)),
        ],
        token_limits={"agents": RateLimit(rate=0.001, burst=4)},
    )
    api = HubApi(hub, auth=auth, clock=lambda: NOW)
    body = orjson.dumps(doc())
    with TestClient(api.asgi) as served:  # the lifespan reaches the app behind it
        full = TestClient(api.app)
        for client in (served, full):
            anonymous = client.post("/api/v1/ingest", content=body)
            assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
            scoped = client.post(
                "/api/v1/ingest", content=body, headers={"Authorization": f"Bearer {reader}"}
            )
            assert scoped.status_code == 403 and "lacks the scope 'ingest'" in scoped.json()["error"]
        assert hub.counters.get("auth_refused_401") == hub.counters.get("auth_refused_403") == 2

        as_agent = {"Authorization": f"Bearer {agent}", "Content-Type": "application/json"}
        first = served.post("/api/v1/ingest", content=body, headers=as_agent)
        again = full.post("/api/v1/ingest", content=body, headers=as_agent)
        assert first.status_code == again.status_code == 200
        assert first.json()["accepted"]["samples"] == 1 and again.json()["duplicate"] is True
        refusals = [c.post("/api/v1/ingest", content=body[:-2], headers=as_agent) for c in (served, full)]
        assert [r.status_code for r in refusals] == [400, 400]
        assert refusals[0].json() == refusals[1].json() and refusals[0].json()["field"]
        assert hub.counters.get("api_refused_400") == 2
        # one token bucket for both ways in: four requests spent the burst of four
        limited = served.post("/api/v1/ingest", content=body, headers=as_agent)
        assert limited.status_code == 429 and "rate limit of token 'agents'" in limited.json()["error"]
        assert int(limited.headers["retry-after"]) >= 1

        # everything else is the app's: other methods on the path, reads
        assert (
            served.get("/api/v1/ingest", headers={"Authorization": f"Bearer {reader}"}).json()["field"]
            == "method"
        )
        assert served.get("/api/v1/health", headers={"Authorization": f"Bearer {reader}"}).status_code == 200
