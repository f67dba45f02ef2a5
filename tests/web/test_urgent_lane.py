"""The urgent lane: a hub that sheds load still takes a sender's small request of hard-fault events
(an XID, a lost GPU), so shedding does not delay the alert; and the lane is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.types import Message

from gpuscope.hub import Hub
from gpuscope.ingest.overload import URGENT_EVENTS, URGENT_HEADER, OverloadMonitor, OverloadSettings
from gpuscope.ingest.payload import Limits
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.guard import PRINCIPAL_KEY
from gpuscope.web.ingest_route import IngestRoute

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


def post(route: IngestRoute, body: dict[str, Any], urgent: bool = False) -> tuple[int, dict[bytes, bytes]]:
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
    return sent[0]["status"], dict(sent[0]["headers"])


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
    assert post(route, frames("node-2", 0), urgent=True)[0] == 200  # small, marked: taken too
    changes = hub.evaluate(NOW + 1)
    fired = {(c.alert.rule, c.alert.entity.get("node"), c.alert.entity.get("gpu")) for c in changes}
    assert ("gpu_xid_fatal", "node-1", "1") in fired
    # nothing acknowledged is lost: what was answered 200 is stored, what was shed is not
    assert [e.labels["node"] for e in hub.store.events(0, 2000, kind="xid")] == ["node-1"]
    assert hub.overload.status(NOW)["urgent_admitted_while_behind"] == 2
    assert hub.overload.status(NOW)["shed_requests"] == 1


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
