"""A cluster member groups notifications as a single hub does: alerts of one group that fire
together wait ``group_wait`` and go out as one notification, and a later member of the group waits
``group_interval``. Two members share a real PostgreSQL; the test drives the clocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alert.sink import Sink
from cluster.rig import cluster_of, nodes_of, two_members
from gpuscope.ingest.payload import parse_batch
from gpuscope.runtime import Runtime
from support import wait_until

SHARDS = 8


def _sections(sink: Sink) -> dict[str, Any]:
    return {
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
        "routes": [{"receiver": "hook", "group_by": ["rule"], "group_wait": "30s", "group_interval": "60s"}],
    }


@pytest.fixture
def members(postgres_dsn: str, tmp_path: Path) -> Iterator[tuple[Runtime, Runtime, Sink]]:
    with two_members(tmp_path, postgres_dsn, SHARDS, _sections) as (a, b, sink):
        for runtime in (a, b):
            runtime.alerting.outbox.start()  # delivery runs; evaluation and the alerting clock are the test's
        yield a, b, sink


def _faulty(runtime: Runtime, node: str, ts: float) -> None:
    """An uncorrectable ECC error on ``node``, reported to the member that owns it."""
    for at, dbe in ((ts - 1, 0.0), (ts, 2.0)):
        frame = {
            "ts": at,
            "metrics": ["gpu_ecc_dbe_volatile_total", "gpu_temp_celsius"],
            "entities": [{"node": node, "gpu": "0"}],
            "values": [[dbe, 60.0]],
        }
        runtime.hub.ingest(parse_batch({"source": f"agent-{node}", "frames": [frame]}))


def _ecc(sink: Sink) -> list[Any]:
    """The notifications of the ECC group (the silent nodes also raise node_unreachable: another
    group, sent on its own)."""
    return [
        body
        for body in sink.bodies("/hook")
        if {x["labels"]["rule"] for x in body["alerts"]} == {"gpu_ecc_uncorrectable"}
    ]


def test_a_member_batches_a_group_for_group_wait_then_group_interval(
    members: tuple[Runtime, Runtime, Sink],
) -> None:
    a, b, sink = members
    nodes = nodes_of(cluster_of(b), 4, SHARDS)
    t0 = time.time()
    clock = [t0]
    for runtime in (a, b):
        runtime.alerting.clock = lambda: clock[0]
        runtime.alerting.outbox.clock = lambda: time.time() + 200  # rows are due at the test's times

    def tick(at: float) -> None:
        clock[0] = at
        for runtime in (a, b):
            runtime.alerting.tick(at)

    for node in nodes[:3]:
        _faulty(b, node, t0)
    assert len(b.hub.evaluate(t0)) == 3 and a.hub.evaluate(t0) == []
    assert b.alerting.drain(10.0)  # triaged and dispatched, as its worker would
    tick(t0 + 10)
    time.sleep(1.5)  # the outbox polls at least every second: anything queued would be here
    assert _ecc(sink) == []  # still within group_wait
    tick(t0 + 31)
    wait_until(lambda: _ecc(sink), 10, "the group's first notification")
    (first,) = _ecc(sink)
    assert sorted(x["labels"]["node"] for x in first["alerts"]) == sorted(nodes[:3])

    clock[0] = t0 + 40
    _faulty(b, nodes[3], t0 + 40)
    changes = {
        (c.alert.entity["node"], c.kind)
        for c in b.hub.evaluate(t0 + 40)
        if c.alert.rule == "gpu_ecc_uncorrectable"
    }
    assert b.alerting.drain(10.0)
    assert (nodes[3], "fired") in changes
    tick(t0 + 50)
    time.sleep(1.5)
    assert len(_ecc(sink)) == 1  # a change to a group already sent waits group_interval
    tick(t0 + 92)
    wait_until(lambda: len(_ecc(sink)) == 2, 10, "the group's second notification")
    time.sleep(1.0)  # anything sent twice would be here by now
    assert len(_ecc(sink)) == 2
    told = {(x["labels"]["node"], x["status"]) for x in _ecc(sink)[1]["alerts"]}
    # one notification: the new alert, with what became of the others since the first
    resolved = {node for node, kind in changes if kind == "resolved"}
    assert told == {(nodes[3], "firing")} | {
        (node, "resolved" if node in resolved else "firing") for node in nodes[:3]
    }
