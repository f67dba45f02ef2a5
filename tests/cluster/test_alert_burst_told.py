"""A burst of alerts fired in one evaluation on a cluster member is told, every alert once: by the
member itself, and by the member that takes its shards over when it is killed right after the
evaluation (issue 13, the (c) run's "never notified" alerts). The evaluation joins the burst to
its incidents in one pass over the cluster's alerts: one per alert made it quadratic (200 alerts
beside 800 older ones: 17 s in the evaluator, nobody told meanwhile).

Two in-process members share a real PostgreSQL; notifications go to a real webhook receiver, one
group per alert (``group_wait`` 0, ``repeat_interval`` 24 h: any second notification of an alert
is a duplicate)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alert.rig import Scripted, lost
from alert.sink import Sink
from cluster.rig import cluster_of, kill, nodes_of, two_members, wait_for_shards
from gpuscope.detect.engine import DetectionEngine
from gpuscope.ingest.payload import parse_batch
from gpuscope.runtime import Runtime
from support import wait_until

SHARDS = 8
BURST = 200
RULE = "gpu_ecc_uncorrectable"


def _sections(sink: Sink, group_interval: str) -> dict[str, Any]:
    return {
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
        "routes": [
            {
                "receiver": "hook",
                "group_by": ["..."],
                "group_wait": "0s",
                "group_interval": group_interval,
                "repeat_interval": "24h",
            }
        ],
    }


@pytest.fixture
def members(
    postgres_dsn: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Runtime, Runtime, Sink]]:
    interval = getattr(request, "param", "1s")
    with two_members(tmp_path, postgres_dsn, SHARDS, lambda sink: _sections(sink, interval), 1) as pair:
        yield pair


def _burst(runtime: Runtime, n: int, ts: float) -> list[str]:
    """``n`` nodes of the member's shards, each with an uncorrectable ECC error, in one batch."""
    nodes = nodes_of(cluster_of(runtime), n, SHARDS)
    frames = [
        {
            "ts": at,
            "metrics": ["gpu_ecc_dbe_volatile_total", "gpu_temp_celsius"],
            "entities": [{"node": node, "gpu": "0"} for node in nodes],
            "values": [[dbe, 60.0] for _ in nodes],
        }
        for at, dbe in ((ts - 1, 0.0), (ts, 2.0))
    ]
    runtime.hub.ingest(parse_batch({"source": "agent-burst", "frames": frames}))
    return nodes


def _told(sink: Sink) -> Counter[str]:
    """node -> how many firing notifications of its ECC alert the receiver got."""
    seen: Counter[str] = Counter()
    for body in sink.bodies("/hook"):
        for alert in body["alerts"]:
            if alert["labels"].get("alertname") == RULE and alert["status"] == "firing":
                seen[alert["labels"]["node"]] += 1
    return seen


def test_a_burst_fired_in_one_evaluation_is_told_once_per_alert(
    members: tuple[Runtime, Runtime, Sink],
) -> None:
    a, b, sink = members
    for runtime in (a, b):
        runtime.alerting.start()
    t0 = time.time()
    nodes = _burst(b, BURST, t0)
    assert b.cluster is not None
    views = b.cluster.state.views
    started = time.monotonic()
    fired = [c for c in b.hub.evaluate(t0) if c.alert.rule == RULE and c.kind == "fired"]
    evaluated = time.monotonic()
    assert sorted(c.alert.entity["node"] for c in fired) == sorted(nodes)
    # the burst joined its incidents in one pass over the cluster's alerts, not one per alert
    assert b.cluster.state.views == views + 1
    incidents = {i.id: set(i.members) for i in b.hub.alert_view()[1]}
    assert all(c.alert.id in incidents.get(c.alert.incident or "", ()) for c in fired)
    wait_until(lambda: set(_told(sink)) == set(nodes), 300, f"all {BURST} alerts told")
    told_at = time.monotonic()
    time.sleep(2.0)  # a second notification of any alert would be here by now
    assert _told(sink) == Counter({node: 1 for node in nodes})
    assert b.alerting.drain(30.0)
    ids = {c.alert.id for c in fired}  # their playbooks, saved by passes of the triage worker
    assert sum(1 for x in a.hub.alert_view()[0] if x.id in ids and "playbook" in x.details) == BURST
    print(
        f"{BURST} alerts: evaluation {evaluated - started:.1f} s, "
        f"all told {told_at - evaluated:.1f} s after it"
    )


@pytest.mark.parametrize("dispatched", [0, BURST // 2])
def test_a_burst_of_a_member_killed_after_its_evaluation_is_told_once_by_the_survivor(
    members: tuple[Runtime, Runtime, Sink], dispatched: int
) -> None:
    """The member that fired the burst dispatches ``dispatched`` of its alerts into the cluster's
    outbox (delivers none) and is killed; the survivor takes its shards and tells the rest."""
    a, b, sink = members
    assert a.cluster is not None and b.cluster is not None
    a.alerting.start()
    t0 = time.time()
    nodes = _burst(b, BURST, t0)
    fired = [c for c in b.hub.evaluate(t0) if c.alert.rule == RULE and c.kind == "fired"]
    assert len(fired) == BURST
    for _ in range(dispatched):  # what its triage worker got through before the kill
        assert b.alerting.queue._work_pass(most=1) == 1
    kill(b.cluster)
    killed = time.monotonic()
    wait_for_shards([a.cluster], SHARDS, 30)  # the takeover
    wait_until(lambda: set(_told(sink)) == set(nodes), 300, f"all {BURST} alerts told by the survivor")
    told_at = time.monotonic()
    time.sleep(2.0)
    assert _told(sink) == Counter({node: 1 for node in nodes})
    print(
        f"{BURST} alerts, {dispatched} dispatched before the kill: all told {told_at - killed:.1f} s after it"
    )


def _statuses(sink: Sink) -> Counter[tuple[str, str]]:
    """(node, status) -> how many times the receiver was told it, of ``gpu_lost`` alerts."""
    seen: Counter[tuple[str, str]] = Counter()
    for body in sink.bodies("/hook"):
        for alert in body["alerts"]:
            if alert["labels"].get("alertname") == "gpu_lost":
                seen[(alert["labels"]["node"], alert["status"])] += 1
    return seen


@pytest.mark.parametrize("members", ["3s"], indirect=True)
@pytest.mark.parametrize("end", ["killed", "stopped"])
def test_what_a_killed_member_resolved_and_had_not_told_is_told_by_the_survivor(
    members: tuple[Runtime, Runtime, Sink], end: str
) -> None:
    """The member dies (or stops, as ``Runtime.stop`` does: alerting first, then it leaves) with
    a resolution waiting for its group's ``group_interval`` (told firing, not resolved) and an
    alert that fired and resolved while its changes were still queued (told nothing): the
    survivor tells what is left, each once."""
    a, b, sink = members
    assert a.cluster is not None and b.cluster is not None
    told, waiting, queued = nodes_of(b.cluster, 3, SHARDS)
    script = Scripted()
    b.hub.detection = DetectionEngine([script])
    b.hub.alerts.resolve_after = 0.0
    b.alerting.outbox.start()  # b delivers; its triage worker and clock are the test's
    a.alerting.start()
    t0 = time.time()
    script.findings = [lost("0", told), lost("0", waiting)]
    b.hub.evaluate(t0)
    assert b.alerting.drain(10.0)
    wait_until(lambda: _statuses(sink)[(waiting, "firing")] == 1, 10, "the firing notifications")
    script.findings = [lost("0", told)]
    b.hub.evaluate(t0 + 1)  # `waiting` resolves: its group was sent just now, so it waits 3 s
    assert b.alerting.drain(10.0)
    script.findings = [lost("0", told), lost("0", queued)]
    b.hub.evaluate(t0 + 2)
    script.findings = [lost("0", told)]
    b.hub.evaluate(t0 + 3)  # `queued` fired and resolved: both changes still in b's queue
    if end == "killed":
        kill(b.cluster)
    else:  # its queue is dispatched on the way out; what waits in its groups is left
        b.alerting.stop()
        b.cluster.leave()
    wait_for_shards([a.cluster], SHARDS, 30)  # the takeover
    wait_until(
        lambda: _statuses(sink)[(waiting, "resolved")] and _statuses(sink)[(queued, "resolved")],
        30,
        "the resolutions the killed member owed",
    )
    time.sleep(4.0)  # a second notification would be here by now (group_interval 3 s)
    seen = _statuses(sink)
    assert seen[(waiting, "firing")] == seen[(waiting, "resolved")] == 1
    assert seen[(queued, "firing")] == seen[(queued, "resolved")] == 1
    assert seen[(told, "firing")] == 1  # still firing: continued, not told again
