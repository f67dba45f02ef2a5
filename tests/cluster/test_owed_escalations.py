"""What a dead or departing owner owed besides resolutions (issue 13): an alert that reached a
graver tier (P2 -> P1) while its change waited in the owner's triage queue or group, a repeat
(``repeat_interval``) and an escalation level (``alerting.escalation``) that fall due after it is
gone. The member taking its shards over tells each once, when it is due: not earlier, not twice.

Two in-process members share a real PostgreSQL; notifications go to a real webhook receiver, one
group per node, one alert each (``group_interval`` 10 s, ``repeat_interval`` 100 s, escalation to
a pager after 60 s), grouped by node or by every label (``group_by: [...]``, whose groups split by
severity: the escalated alert moves to its P1 group, which alone tells it). The test drives the
alerting clocks; the outbox delivers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alert.rig import Scripted, hot, lost
from alert.sink import Sink
from cluster.rig import cluster_of, kill, nodes_of, two_members, wait_for_shards
from gpuscope.detect.engine import DetectionEngine
from gpuscope.model import Finding
from gpuscope.runtime import Runtime
from support import wait_until

SHARDS = 8


def _sections(sink: Sink, group_by: list[str]) -> dict[str, Any]:
    return {
        "receivers": [
            {"name": "hook", "webhook": {"url": f"{sink.url}/hook"}},
            {"name": "pager", "webhook": {"url": f"{sink.url}/pager"}},
        ],
        "routes": [
            {
                "receiver": "hook",
                "group_by": group_by,
                "group_wait": "0s",
                "group_interval": "10s",
                "repeat_interval": "100s",
            }
        ],
        "alerting": {"escalation": [{"after": "60s", "receiver": "pager"}]},
    }


@pytest.fixture(params=[["node"], ["..."]], ids=["by-node", "by-every-label"])
def members(
    postgres_dsn: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Runtime, Runtime, Sink]]:
    def sections(sink: Sink) -> dict[str, Any]:
        return _sections(sink, request.param)

    with two_members(tmp_path, postgres_dsn, SHARDS, sections, lease_s=1) as pair:
        yield pair


def _told(sink: Sink, path: str) -> list[tuple[str, str, str]]:
    """(node, status, severity) of each alert in each notification to ``path``, in arrival order."""
    return [
        (x["labels"]["node"], x["status"], x["labels"]["severity"])
        for body in sink.bodies(path)
        for x in body["alerts"]
    ]


@pytest.mark.parametrize(
    ("end", "escalation"), [("killed", "queued"), ("stopped", "queued"), ("killed", "told")]
)
def test_an_escalation_a_repeat_and_a_page_the_dead_owner_owed_are_told_once_when_due(
    members: tuple[Runtime, Runtime, Sink], end: str, escalation: str
) -> None:
    """``queued``: the owner dies (or stops) with the escalation in its triage queue; ``told``:
    it told the escalation at t0 + 10 and was killed then (nobody may tell it again)."""
    a, b, sink = members
    graver, repeated, paged = nodes_of(cluster_of(b), 3, SHARDS)
    script = Scripted()  # the conditions as every member's detectors would see them
    t0 = time.time()
    clock = [t0]
    for runtime in (a, b):
        runtime.hub.detection = DetectionEngine([script])
        runtime.hub.alerts.resolve_after = 0.0
        runtime.alerting.clock = lambda: clock[0]
        runtime.alerting.outbox.clock = lambda: time.time() + 1000  # rows are due at the test's times
        runtime.alerting.outbox.start()  # delivery runs; triage, dispatch and the clock are the test's

    def tick(runtime: Runtime, at: float) -> None:
        clock[0] = at
        runtime.alerting.tick(at)

    def settled(path: str, count: int) -> list[tuple[str, str, str]]:
        wait_until(lambda: len(_told(sink, path)) >= count, 15, f"{count} alerts told to {path}")
        time.sleep(1.5)  # the outbox polls at least every second: anything more queued would be here
        told = _told(sink, path)
        assert len(told) == count, told
        return told

    script.findings = [hot(node=graver), hot(node=repeated), lost(node=paged)]
    b.hub.evaluate(t0)
    assert b.alerting.drain(10.0)  # told at t0: group_wait 0
    settled("/hook", 3)
    clock[0] = t0 + 5
    p1 = Finding("gpu_thermal_throttle", {"node": graver, "gpu": "2"}, "throttles hard", severity="P1")
    script.findings = [p1, hot(node=repeated), lost(node=paged)]
    (change,) = b.hub.evaluate(t0 + 5)
    assert (change.kind, change.alert.severity) == ("escalated", "P1")
    # every member shows the graver tier from now on
    assert {x.entity["node"]: x.severity for x in a.hub.alert_view()[0]}[graver] == "P1"
    if escalation == "told":
        assert b.alerting.drain(10.0)
        tick(b, t0 + 10)  # group_interval after its first notification
        assert settled("/hook", 4)[3] == (graver, "firing", "P1")
    if end == "killed":
        kill(cluster_of(b))
    else:  # its queue is dispatched on the way out: the escalation waits for group_interval, left
        b.alerting.stop()
        cluster_of(b).leave()
    clock[0] = t0 + 6
    wait_for_shards([cluster_of(a)], SHARDS, 30)
    assert a.hub.evaluate(t0 + 6) == []  # a continues them: its detectors see P1 on a P1 alert
    assert a.alerting.drain(10.0)

    first = [(graver, "firing", "P2"), (repeated, "firing", "P2"), (paged, "firing", "P1")]
    if escalation == "queued":
        tick(a, t0 + 9)
        assert settled("/hook", 3) == first
    tick(a, t0 + 11)  # group_interval after the send the ledger recorded, as on the owner
    assert settled("/hook", 4) == [*first, (graver, "firing", "P1")]
    tick(a, t0 + 59)
    settled("/pager", 0)
    tick(a, t0 + 61)  # the escalation level is due 60 s after each P1 fired: the new owner pages
    assert sorted(settled("/pager", 2)) == sorted([(graver, "firing", "P1"), (paged, "firing", "P1")])
    tick(a, t0 + 99)
    settled("/hook", 4)
    tick(a, t0 + 101)  # repeat_interval after the send the ledger recorded
    assert sorted(settled("/hook", 6)[4:]) == sorted([(repeated, "firing", "P2"), (paged, "firing", "P1")])
    tick(a, t0 + 102)
    settled("/hook", 6)
    settled("/pager", 2)
