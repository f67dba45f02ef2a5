"""The urgent lane: a hub that sheds load still takes a sender's small request of hard-fault events
(an XID, a lost GPU), so shedding does not delay the alert; and the lane is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Message

from gpuscope.hub import Hub
from gpuscope.ingest.overload import URGENT_EVENTS, URGENT_HEADER, OverloadMonitor, OverloadSettings
from gpuscope.ingest.payload import Limits
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.guard import PRINCIPAL_KEY
from gpuscope.web.ingest_route import IngestRoute
from gpuscope.web.server import HubServer

NOW = 1000.0
URGENT = URGENT_HEADER.lower().encode()


def frames(node: str, k: int) -> dict[str, Any]:
    return {
        "source": node,
        "batch_id": f"{node}:{k}",
        "frames": [
            {
                "ts": 990.0 + k,
                "metrics": ["gpu_utilization_percent"],
                "entities": [{"node": node, "gpu": "0"}],
                "values": [[97.0]],
            }
        ],
    }


def xid(node: str, k: int) -> dict[str, Any]:
    event = {"ts": 995.0, "kind": "xid", "labels": {"node": node, "gpu": "1"}, "data": {"code": 79}}
    return {"source": node, "batch_id": f"{node}:{k}:urgent", "events": [event]}


def exchange(route: IngestRoute, body: dict[str, Any], urgent: bool = False) -> list[Message]:
    """The ASGI messages the route sends for one ingest post."""
    raw = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if urgent:
        headers.append((URGENT, URGENT_EVENTS.encode()))
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/api/v1/ingest", "headers": headers}
    scope[PRINCIPAL_KEY] = object()
    queue: list[Message] = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        return queue.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(route(scope, receive, send))
    return sent


def post(route: IngestRoute, body: dict[str, Any], urgent: bool = False) -> tuple[int, dict[bytes, bytes]]:
    sent = exchange(route, body, urgent)
    return sent[0]["status"], dict(sent[0]["headers"])


def post_answer(route: IngestRoute, body: dict[str, Any], urgent: bool = False) -> tuple[int, Any]:
    """The status and decoded answer of a post."""
    sent = exchange(route, body, urgent)
    return sent[0]["status"], orjson.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.fixture
def hub() -> Iterator[Hub]:
    h = Hub(DuckDBStore(":memory:"))
    settings = OverloadSettings(max_lag_s=1.0, max_urgent_in_flight=2, max_urgent_bytes=1024)
    h.overload = OverloadMonitor(settings)
    yield h
    h.store.close()


def test_a_hub_past_capacity_sheds_frames_but_takes_an_xid_and_alerts_on_the_next_tick(hub: Hub) -> None:
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    assert post(route, frames("node-1", 0))[0] == 200
    hub.overload.observe_lag(NOW, 30.0)  # its detectors are 30 s behind: it sheds
    status, headers = post(route, frames("node-1", 1))
    assert status == 503 and int(headers[b"retry-after"]) >= 1
    assert post(route, xid("node-1", 1), urgent=True)[0] == 200  # the fault is not shed
    assert post(route, frames("node-2", 0), urgent=True)[0] == 400  # metrics marked urgent: refused
    changes = hub.evaluate(NOW + 1)
    fired = {(c.alert.rule, c.alert.entity.get("node"), c.alert.entity.get("gpu")) for c in changes}
    assert ("gpu_xid_fatal", "node-1", "1") in fired
    # nothing acknowledged is lost: what was answered 200 is stored, what was shed is not
    assert [e.labels["node"] for e in hub.store.events(0, 2000, kind="xid")] == ["node-1"]
    assert hub.store.series("gpu_utilization_percent", {"node": "node-2"}, 0, 2000) == []
    assert hub.overload.status(NOW)["urgent_admitted_while_behind"] == 2
    assert hub.overload.status(NOW)["shed_requests"] == 1


def heartbeat(node: str, k: int) -> dict[str, Any]:
    event = {"ts": 995.0, "kind": "heartbeat", "labels": {"job": "j", "rank": "0"}, "data": {"step": 3}}
    return {"source": node, "batch_id": f"{node}:{k}:urgent", "events": [xid(node, k)["events"][0], event]}


def steps(node: str, k: int) -> dict[str, Any]:
    record = {"ts": 995.0, "job": "j", "rank": 0, "step": 3, "metrics": {"loss": 2.0}}
    return {**xid(node, k), "training": [record]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (frames("node-2", 0), "frames"),
        (steps("node-2", 0), "training"),
        (heartbeat("node-2", 0), "events[1].kind"),
        ({"source": "node-2", "batch_id": "node-2:0:urgent", "events": []}, "events"),
    ],
)
def test_a_request_marked_urgent_carries_hard_fault_events_only(
    hub: Hub, body: dict[str, Any], field: str
) -> None:
    """The lane is admitted while the hub sheds: metrics, training records or routine events sent
    through it are refused at decode, naming the field, and counted; nothing of them is stored."""
    route = IngestRoute(hub, Limits(), clock=lambda: NOW)
    hub.overload.observe_lag(NOW, 30.0)  # shedding: only the lane is open
    status, answer = post_answer(route, body, urgent=True)
    assert status == 400 and answer["field"] == field and "X-Gpuscope-Urgent" in answer["error"]
    assert hub.counters.get("ingest_refused_urgent") == 1
    assert hub.store.events(0, 2000) == [] and hub.store.training("j", 0, 2000) == []
    assert post(route, body)[0] == 503  # unmarked, the same batch is shed like any other


def test_the_lean_path_refuses_metrics_marked_urgent_as_the_asgi_path_does(hub: Hub) -> None:
    server = HubServer(hub, "127.0.0.1", 0)
    server.start()
    try:
        url = f"{server.url}/api/v1/ingest"
        marked = {"Content-Type": "application/json", URGENT_HEADER: URGENT_EVENTS}
        reply = httpx.post(url, content=orjson.dumps(frames("node-2", 0)), headers=marked)
        assert reply.status_code == 400 and reply.json()["field"] == "frames"
        assert httpx.post(url, content=orjson.dumps(xid("node-2", 1)), headers=marked).status_code == 200
        assert hub.counters.get("ingest_refused_urgent") == 1
        assert [e.kind for e in hub.store.events(0, 2000)] == ["xid"]
    finally:
        server.stop()


def test_the_urgent_lane_is_bounded_in_size_and_requests_in_flight() -> None:
    monitor = OverloadMonitor(OverloadSettings(max_urgent_in_flight=2, max_urgent_bytes=1024))
    monitor.observe_lag(NOW, 30.0)
    assert monitor.admit(NOW, None, urgent_bytes=4096).ticket is None  # too large for the lane
    assert monitor.admit(NOW, None).ticket is None  # not marked: shed
    first = monitor.admit(NOW, None, urgent_bytes=500).ticket
    second = monitor.admit(NOW, None, urgent_bytes=500).ticket
    assert first is not None and second is not None
    assert monitor.admit(NOW, None, urgent_bytes=500).ticket is None  # two in flight already
    monitor.done(first)
    assert monitor.admit(NOW, None, urgent_bytes=500).ticket is not None  # one answered: room again


def test_urgent_limits_that_are_not_whole_numbers_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"overload\.max_urgent_bytes"):
        OverloadSettings(max_urgent_bytes=0)
