"""Triage off the evaluator's thread: slow playbooks never stop detection, the order of an alert's
changes holds, the queue and the wait are bounded and counted, and a stopping hub sends what fired.

The slow playbook is a real check registered for ``gpu_lost``: it waits until the test opens its
gate (:class:`Gate`), as a check stuck on a slow store would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from alert.rig import Rig, Scripted, hot, lost
from alert.sink import Clock, Sink
from gpuscope.alert.checks import CHECKS, CheckResult, Context
from gpuscope.alert.playbooks import PLAYBOOKS, Playbook, Step
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.config import load_config
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.runtime import assemble
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi

OPENED = "the gate opened"
#: a hung playbook is let go after this long, so that a regression fails instead of hanging
SAFETY_S = 20.0


class Gate:
    """The ``gpu_lost`` playbook's one check: waits until :meth:`open` (counts who entered)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        monkeypatch.setitem(CHECKS, "test_gate", self)
        book = Playbook("work on the GPU stops", (Step("wait for the gate", "test_gate"),), ("reseat it",))
        monkeypatch.setitem(PLAYBOOKS, "gpu_lost", book)
        self._safety = threading.Timer(SAFETY_S, self.opened.set)
        self._safety.daemon = True
        self._safety.start()

    def __call__(self, ctx: Context) -> CheckResult:
        self.calls += 1
        self.entered.set()
        self.opened.wait()
        return CheckResult("found", OPENED)

    def open(self) -> None:
        self.opened.set()
        self._safety.cancel()


class Harness:
    """A hub with scripted findings and a started alerting service notifying ``sink``: one group
    per node, sent at once (no group_wait, no group_interval)."""

    def __init__(self, sink: Sink, **service: Any) -> None:
        self.store = DuckDBStore(":memory:", durable=False)
        self.hub = Hub(self.store)
        self.hub.alerts.resolve_after = 0.0
        self.script = Scripted()
        self.hub.detection = DetectionEngine([self.script])
        cfg = {
            "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
            "routes": [
                {"receiver": "hook", "group_by": ["node"], "group_wait": "0s", "group_interval": "0s"}
            ],
        }
        self.service = AlertingService(self.hub, parse_alerting(cfg), **service)
        self.service.start()
        self.now = time.time()

    def evaluate(self, findings: list[Any]) -> tuple[list[tuple[str, str]], float]:
        """One evaluation a second after the last: (kind, node) of each change, and its wall time."""
        self.script.findings = findings
        self.now += 1.0
        started = time.monotonic()
        changes = self.hub.evaluate(self.now)
        return [(c.kind, c.alert.entity["node"]) for c in changes], time.monotonic() - started

    def close(self) -> None:
        self.service.stop()
        self.store.close()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate(monkeypatch)
    yield g
    g.open()


def told(sink: Sink) -> list[tuple[str, str, bool]]:
    """(node, status, with the playbook's diagnosis) of every alert notified, in arrival order."""
    return [
        (a["labels"]["node"], a["status"], "diagnosis" in a["annotations"])
        for body in sink.bodies("/hook")
        for a in body["alerts"]
    ]


def test_a_burst_whose_playbooks_hang_does_not_stop_detection(sink: Sink, gate: Gate) -> None:
    h = Harness(sink)
    try:
        burst = [lost("0", f"node-{i}") for i in range(20)]
        changes, took = h.evaluate(burst)
        assert len(changes) == 20 and took < 5.0  # the first playbook hangs until SAFETY_S
        assert gate.entered.wait(10)
        # the next evaluation runs, and detects a new fault, while the burst's playbooks hang
        changes, took = h.evaluate([*burst, hot(node="node-99")])
        assert changes == [("fired", "node-99")] and took < 5.0
        status = TestClient(HubApi(h.hub, alerting=h.service).app).get("/api/v1/alerting/status").json()
        assert status["triage"]["depth"] == 21 and status["triage"]["oldest_wait_seconds"] > 0
        assert status["triage"]["size"] == 4096 and status["triage"]["budget_seconds"] == 30.0
        assert sink.bodies() == []  # nothing overtook the hung playbook
        gate.open()
        assert h.service.drain(10.0)
        sink.wait_for(21)
        received = told(sink)
        # every alert, in the order it fired, with its playbook's answers
        assert [node for node, _, _ in received] == [f"node-{i}" for i in range(20)] + ["node-99"]
        assert all(status == "firing" for _, status, _ in received)
        assert all(diagnosed for node, _, diagnosed in received if node != "node-99")
        assert h.service.triage_stats()["depth"] == 0
        assert h.hub.alerts.firing()[0].details["playbook"]["summary"] == OPENED
    finally:
        gate.open()
        h.close()


def test_a_resolution_never_overtakes_its_alert_even_when_its_playbook_is_over_budget(
    sink: Sink, gate: Gate
) -> None:
    h = Harness(sink, triage_budget=5.0)
    queue_clock = Clock(0.0)
    h.service.queue.clock = queue_clock  # the budget runs on a clock the test moves
    try:
        assert h.evaluate([lost()])[0] == [("fired", "node-1")]
        assert gate.entered.wait(10)  # its playbook hangs
        assert h.evaluate([])[0] == [("resolved", "node-1")]  # fired and resolved inside the burst
        h.service.tick()
        assert sink.bodies() == []  # within the budget: the alert waits for its playbook
        queue_clock.t += 6.0
        h.service.tick()  # past the budget: sent without the playbook, then its resolution
        sink.wait_for(2)
        assert told(sink) == [("node-1", "firing", False), ("node-1", "resolved", False)]
        first = sink.bodies("/hook")[0]["alerts"][0]["annotations"]
        assert first["meaning"] and first["mitigation"] == "reseat it"  # the playbook's fixed parts
        assert h.hub.counters.get("triage_skipped_over_budget") == 1
        gate.open()
        assert h.service.drain(10.0)
        (alert,) = h.hub.alerts.all()
        assert alert.details["playbook"]["summary"] == OPENED  # attached late, for pages and the API
        assert h.hub.counters.get("playbooks_attached_late") == 1
        h.service.outbox.deliver_due()
        assert len(sink.bodies()) == 2  # and nobody is told again
        what = [e["what"] for e in h.service.history(alert.id)]
        assert what == ["fired", "triage_skipped", "notified_firing", "resolved", "notified_resolved"]
    finally:
        gate.open()
        h.close()


def test_a_full_queue_sends_its_oldest_alerts_without_playbooks_and_loses_none(
    sink: Sink, gate: Gate
) -> None:
    h = Harness(sink, triage_queue=2)
    try:
        h.evaluate([lost("0", "node-0")])
        assert gate.entered.wait(10)
        changes, took = h.evaluate([lost("0", f"node-{i}") for i in range(5)])
        assert len(changes) == 4 and took < 5.0
        # node-0 (in the worker's hand), node-1 and node-2 made room, in order; node-3, node-4 wait
        assert h.hub.counters.get("triage_skipped_queue_full") == 3
        assert h.service.triage_stats()["depth"] == 2
        sink.wait_for(3)
        assert told(sink) == [(f"node-{i}", "firing", False) for i in range(3)]
        gate.open()
        assert h.service.drain(10.0)
        sink.wait_for(5)
        assert told(sink)[3:] == [("node-3", "firing", True), ("node-4", "firing", True)]
        assert h.hub.counters.get("playbooks_attached_late") == 1  # node-0's, once it ended
    finally:
        gate.open()
        h.close()


def test_a_stopping_queue_sends_what_it_could_not_triage_in_time(sink: Sink, gate: Gate) -> None:
    h = Harness(sink)
    try:
        h.evaluate([lost("0", f"node-{i}") for i in range(3)])
        assert gate.entered.wait(10)
        h.service.queue.stop(timeout=0.2)
        assert h.hub.counters.get("triage_skipped_at_stop") == 3
        assert h.service.triage_stats()["depth"] == 0
        sink.wait_for(3)
        assert told(sink) == [(f"node-{i}", "firing", False) for i in range(3)]
    finally:
        gate.open()
        h.close()


def test_the_runtime_stops_after_what_fired_was_triaged_and_queued_for_delivery(
    tmp_path: Path, sink: Sink, gate: Gate
) -> None:
    path = tmp_path / "hub.yaml"
    config = {
        "storage": {"path": str(tmp_path / "hub.duckdb")},  # its alert state database goes beside it
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/h"}}],
    }
    path.write_text(yaml.safe_dump(config))
    runtime = assemble(
        load_config(path), store=DuckDBStore(":memory:", durable=False), serve=False, evaluate_interval=None
    )
    script = Scripted()
    runtime.hub.detection = DetectionEngine([script])
    runtime.start()
    script.findings = [lost("0", f"node-{i}") for i in range(3)]
    assert len(runtime.hub.evaluate(time.time())) == 3
    assert gate.entered.wait(10)
    threading.Timer(0.5, gate.open).start()  # triage ends within the stop's drain time
    runtime.stop()
    assert runtime.hub.counters.get("notifications_queued") >= 1
    assert gate.calls == 3 and runtime.hub.counters.get("triage_skipped_at_stop") == 0
    assert all(a.details["playbook"]["summary"] == OPENED for a in runtime.hub.alerts.firing())


def test_group_wait_counts_from_the_firing_not_from_the_end_of_triage(sink: Sink, clock: Clock) -> None:
    rig = Rig(
        {
            "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
            "routes": [{"receiver": "hook", "group_wait": "30s"}],
        },
        clock,
    )
    try:
        rig.script.findings = [lost()]
        rig.hub.evaluate(clock.t)  # fires at t
        rig.step(20)  # its triage and dispatch come 20 s later
        assert sink.bodies() == []
        rig.step(11)  # t + 31: group_wait is over (t + 50 if it counted from the dispatch)
        (body,) = sink.wait_for(1)
        assert body["alerts"][0]["labels"]["node"] == "node-1"
    finally:
        rig.close()


def test_a_shard_let_go_drops_its_undispatched_alerts_for_the_new_owner(sink: Sink, clock: Clock) -> None:
    rig = Rig({"receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}]}, clock)
    try:
        rig.script.findings = [lost("0", "node-1"), lost("0", "node-2")]
        rig.hub.evaluate(clock.t)
        rig.hub.forget_alerts(lambda entity: entity.get("node") == "node-1")
        rig.service.forget(lambda entity: entity.get("node") == "node-1")
        rig.step(0, [lost("0", "node-2")])  # node-1's findings are the new owner's now
        (body,) = sink.wait_for(1)
        assert [a["labels"]["node"] for a in body["alerts"]] == ["node-2"]
    finally:
        rig.close()
