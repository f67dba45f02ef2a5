"""A restarted hub warms its detectors up from the store: a hang that began before the restart is
found without relearning the job, and an alert firing before the restart continues, unnotified."""

from __future__ import annotations

from pathlib import Path

from detect.rig import FakeCluster, FakeJob
from gpuscope.alert.engine import AlertChange
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore


class World:
    """Two training jobs on their own nodes, reporting every second."""

    def __init__(self) -> None:
        self.cluster = FakeCluster(nodes=4, gpus=2)
        names = self.cluster.names
        self.a = FakeJob.on(names[:2], 2, name="job-a")
        self.b = FakeJob.on(names[2:], 2, name="job-b")
        for job in (self.a, self.b):
            self.cluster.allocate(job.name, job.placement)

    def run(self, hub: Hub, start: int, stop: int, changes: list[tuple[float, AlertChange]]) -> None:
        for t in range(start, stop):
            batches: list[Batch | None] = [*self.cluster.batches(t), self.a.batch(t), self.b.batch(t)]
            for batch in batches:
                if batch is not None:
                    hub.ingest(batch)
            changes.extend((t, c) for c in hub.evaluate(float(t)))


def _fired(changes: list[tuple[float, AlertChange]], job: str) -> list[tuple[float, AlertChange]]:
    return [
        (t, c)
        for t, c in changes
        if c.kind == "fired" and c.alert.rule == "training_stalled" and c.alert.entity.get("job") == job
    ]


def _hub(path: Path, told: list[AlertChange]) -> Hub:
    hub = Hub(DuckDBStore(str(path)))
    hub.add_listener(told.append)  # what notifiers would be told
    return hub


def test_restart_keeps_alerts_and_finds_a_hang_that_began_before_it(tmp_path: Path) -> None:
    world = World()
    before: list[tuple[float, AlertChange]] = []
    hub = _hub(tmp_path / "hub.duckdb", [])
    world.run(hub, 0, 100, before)
    world.a.hung = True  # job-a hangs at 100 and fires before the restart
    world.run(hub, 100, 116, before)
    world.b.hung = True  # job-b hangs at 116, moments before the restart
    world.run(hub, 116, 120, before)
    fired_a = _fired(before, "job-a")
    assert fired_a and not _fired(before, "job-b")
    hub.store.close()

    after: list[tuple[float, AlertChange]] = []
    told: list[AlertChange] = []
    restarted = _hub(tmp_path / "hub.duckdb", told)
    restarted.resume(120.0, 900.0)
    assert restarted.counters.get("alerts_resumed") == 1
    assert restarted.counters.get("warmup_batches") > 0
    world.run(restarted, 120, 140, after)

    assert not _fired(after, "job-a")  # continued, not fired again
    assert not [c for c in told if c.alert.entity.get("job") == "job-a"]  # nor notified again
    (still,) = [a for a in restarted.firing() if a.entity.get("job") == "job-a"]
    assert still.id == fired_a[0][1].alert.id
    fired_b = _fired(after, "job-b")
    assert fired_b and fired_b[0][0] <= 130  # within the detector's own budget of the last step
    assert fired_b[0][1].alert.id not in {c.alert.id for _, c in before}  # new ids follow stored ones

    # the same hours without warm-up: a cold hub never saw job-b step, so it cannot tell the hang
    cold_changes: list[tuple[float, AlertChange]] = []
    cold = _hub(tmp_path / "cold.duckdb", [])
    world.run(cold, 120, 140, cold_changes)
    assert not _fired(cold_changes, "job-b")
    restarted.store.close()
    cold.store.close()
