"""The hub's two seams: a placement decides which findings this hub applies and where a batch is
detected; an alert state records every transition and is where the hub's views read from."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from alert.rig import Scripted, lost
from gpuscope.alert.engine import AlertChange
from gpuscope.alert.state import LocalAlertState
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.model import Alert, Batch, Labels
from gpuscope.placement import Observe, WarmUp
from gpuscope.store.duckdb import DuckDBStore


class OneNode:
    """Owns node-1 only; batches are counted, then detected here."""

    def __init__(self) -> None:
        self.batches = 0
        self.held_times = 0

    def observe(self, batch: Batch, local: Observe) -> None:
        self.batches += 1
        local(batch)

    def owns(self, entity: Labels) -> bool:
        return entity.get("node") == "node-1"

    def held(self) -> AbstractContextManager[object]:
        self.held_times += 1
        return nullcontext()

    def resume(self, now: float, window: float, warm_up: WarmUp) -> None:
        warm_up(now, window)


def test_a_hub_applies_only_the_findings_its_placement_owns_and_tells_every_listener() -> None:
    placement = OneNode()
    hub = Hub(DuckDBStore(":memory:", durable=False), placement=placement)
    script = Scripted()
    hub.detection = DetectionEngine([script])
    hub.alerts.resolve_after = 0.0
    heard: list[AlertChange] = []
    hub.add_listener(heard.append)
    script.findings = [lost(node="node-1"), lost(node="node-2")]
    fired = hub.evaluate(100.0)
    assert [c.alert.entity["node"] for c in fired] == ["node-1"]
    assert heard == fired and placement.held_times == 1
    hub.ingest(Batch("agent-node-1"))
    assert placement.batches == 0  # queued for the observe stage: the next evaluation sees it first
    hub.evaluate(101.0)
    assert placement.batches == 1


class Continued(LocalAlertState):
    """Another hub already fires every alert: each fired one is continued, never recorded."""

    def __init__(self, theirs: Alert) -> None:
        super().__init__()
        self.theirs = theirs

    def fired(self, alert: Alert, places: list[Labels] | None, now: float) -> Alert | None:
        return self.theirs


def test_an_alert_another_hub_fires_is_continued_not_fired_again() -> None:
    theirs = Alert(
        id="al-41",
        rule="gpu_lost",
        severity="P1",
        owner="infra",
        entity=dict(lost().entity),
        started_at=50.0,
        summary="GPU lost",
        cost_per_hour=1.0,
    )
    hub = Hub(DuckDBStore(":memory:", durable=False), state=Continued(theirs))
    script = Scripted()
    hub.detection = DetectionEngine([script])
    script.findings = [lost()]
    assert hub.evaluate(100.0) == []
    assert hub.alerts.continued == 1 and hub.alerts.firing() == [theirs]


def test_a_restarted_hub_numbers_new_alerts_after_its_stored_ones_and_reads_them_back() -> None:
    store = DuckDBStore(":memory:", durable=False)
    first = Hub(store)
    script = Scripted()
    first.detection = DetectionEngine([script])
    script.findings = [lost()]
    (fired,) = first.evaluate(100.0)
    second = Hub(store)
    second.resume(200.0, window=0)
    assert [a.id for a in second.firing()] == [fired.alert.id]
    assert second.alerts.next_id() == "al-2"
    assert [a.id for a in second.stored_alerts(firing_only=True)] == [fired.alert.id]
