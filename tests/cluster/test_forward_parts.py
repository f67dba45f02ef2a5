"""Forwarded parts travel several to a request, as binary frames, and arrive as they were sent."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest

from gpuscope.cluster import parts
from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.forward import HOPS_HEADER, OBSERVE_PATH, Forwarder
from gpuscope.counters import Counters
from gpuscope.ingest.payload import PayloadError
from gpuscope.model import Batch, Event, Frame, TrainingRecord


def _part(i: int) -> Batch:
    values = np.array([[float(i), np.nan], [0.5, 2.0]])
    frame = Frame(
        1_700_000_000.0 + i,
        ["gpu_util", "gpu_temp"],
        [{"node": f"n{i}", "gpu": "0", "job": "j"}, {"node": f"n{i}", "gpu": "1"}],
        values,
    )
    event = Event(1_700_000_000.0 + i, "xid", {"node": f"n{i}", "gpu": "0"}, {"code": 79})
    record = TrainingRecord(1_700_000_000.0 + i, "j", 3, 10 + i, {"loss": 0.25}, {"node": f"n{i}"})
    return Batch(f"agent-{i}", frames=[frame], events=[event], training=[record])


def _same(a: Batch, b: Batch) -> bool:
    return (
        a.source == b.source
        and a.batch_id == b.batch_id
        and a.events == b.events
        and a.training == b.training
        and len(a.frames) == len(b.frames)
        and all(
            (f.ts, f.metrics, f.entities) == (g.ts, g.metrics, g.entities)
            and np.array_equal(f.values, g.values, equal_nan=True)
            for f, g in zip(a.frames, b.frames, strict=True)
        )
    )


def test_a_body_of_parts_decodes_to_the_parts_sent() -> None:
    sent = [_part(i) for i in range(5)]
    got = parts.decode_parts(parts.encode_parts([parts.encode_part(p) for p in sent]))
    assert len(got) == 5
    assert all(_same(a, b) for a, b in zip(sent, got, strict=True))


def test_a_cut_or_bad_part_refuses_the_body_naming_the_part() -> None:
    body = parts.encode_parts([parts.encode_part(_part(0)), parts.encode_part(_part(1))])
    with pytest.raises(PayloadError, match=r"parts\[1\]"):
        parts.decode_parts(body[:-3])
    broken = parts.encode_parts([parts.encode_part(_part(0)), b"not a frame at all"])
    with pytest.raises(PayloadError, match=r"parts\[1\]\.header"):
        parts.decode_parts(broken)


def test_parts_queued_while_a_request_is_in_flight_go_in_the_next_request() -> None:
    """The peer holds the first request until 40 more parts are queued: they arrive in one more
    request, all of them, in the order they were queued, none dropped."""
    requests: list[list[Batch]] = []
    release = threading.Event()

    def peer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == OBSERVE_PATH
        assert request.headers["content-type"] == parts.CONTENT_TYPE
        assert request.headers[HOPS_HEADER] == "1"
        assert request.headers["authorization"] == f"Bearer {cfg.peer_token}"
        requests.append(parts.decode_parts(request.read()))
        release.wait(5)
        return httpx.Response(200, json={})

    cfg = ClusterConfig("postgresql://unused", "hub-a", "http://a", "token-0123456789abcdef")
    counters = Counters()
    fwd = Forwarder(
        cfg, lambda hub: "http://peer", lambda part, hops: None, counters, httpx.MockTransport(peer)
    )
    sent = [_part(i) for i in range(41)]
    fwd.send("hub-b", sent[0], 1)
    for _ in range(200):
        if requests:
            break
        threading.Event().wait(0.01)
    for part in sent[1:]:
        fwd.send("hub-b", part, 1)
    release.set()
    fwd.stop()
    assert [len(r) for r in requests] == [1, 40]
    got = [p for r in requests for p in r]
    assert all(_same(a, b) for a, b in zip(sent, got, strict=True))
    snapshot = counters.snapshot()
    assert snapshot.get("cluster_forwarded") == 41
    assert snapshot.get("cluster_forward_dropped", 0) == 0
