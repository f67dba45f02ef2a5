"""A hub reopened on a store whose training job fell silent before the restart (it ended unsaid, as
a stopped demo's jobs did) raises no rank_lost or training_stalled for it; a rank that does not
come back when its job does, or that goes silent after the restart, is still found."""

from __future__ import annotations

from pathlib import Path

from detect.rig import FakeCluster, FakeJob
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore

SILENCE_RULES = ("rank_lost", "training_stalled")


class World:
    """One 4-rank training job on two nodes, everything reporting every second."""

    def __init__(self) -> None:
        self.cluster = FakeCluster(nodes=2, gpus=2)
        self.job = FakeJob.on(self.cluster.names, 2, name="pretrain")
        self.cluster.allocate(self.job.name, self.job.placement)
        self.job_reports = True

    def run(self, hub: Hub, start: int, stop: int) -> None:
        for t in range(start, stop):
            batches: list[Batch | None] = list(self.cluster.batches(t))
            if self.job_reports:
                batches.append(self.job.batch(t))
            for batch in batches:
                if batch is not None:
                    hub.ingest(batch)
            hub.evaluate(float(t))


def lost_ranks(hub: Hub) -> set[str]:
    return {a.entity["rank"] for a in hub.firing() if a.rule == "rank_lost"}


def silence_alerts(hub: Hub) -> list[str]:
    return [f"{a.rule} {a.entity}" for a in hub.alert_view()[0] if a.rule in SILENCE_RULES]


def reopen_after_silence(tmp_path: Path, world: World) -> Hub:
    """The job reports 0-60 s, then stops without a word; the hub stops at 60 s and reopens at 75 s."""
    path = tmp_path / "hub.duckdb"
    hub = Hub(DuckDBStore(str(path)))
    world.run(hub, 0, 60)
    assert not silence_alerts(hub)
    hub.store.close()
    world.job_reports = False
    reopened = Hub(DuckDBStore(str(path)))
    reopened.resume(75.0)
    return reopened


def test_a_job_silent_before_the_restart_raises_nothing_after_it(tmp_path: Path) -> None:
    world = World()
    hub = reopen_after_silence(tmp_path, world)
    try:
        world.run(hub, 75, 200)  # the nodes keep reporting: the hub hears, the job is gone
        assert silence_alerts(hub) == []
        assert hub.detection_stats().get("jobs_silent_before_start") == 1
    finally:
        hub.store.close()


def test_a_rank_that_does_not_come_back_with_its_job_is_found(tmp_path: Path) -> None:
    world = World()
    hub = reopen_after_silence(tmp_path, world)
    try:
        world.run(hub, 75, 90)
        world.job.dead = {3}  # the job speaks again at 90 s, but rank 3 never does
        world.job_reports = True
        world.run(hub, 90, 93)
        assert lost_ranks(hub) == set()  # within the rank's threshold of the job's return
        world.run(hub, 93, 110)
        assert lost_ranks(hub) == {"3"}
    finally:
        hub.store.close()


def test_a_rank_that_goes_silent_after_the_restart_is_found(tmp_path: Path) -> None:
    world = World()
    path = tmp_path / "hub.duckdb"
    hub = Hub(DuckDBStore(str(path)))
    world.run(hub, 0, 60)
    hub.store.close()
    reopened = Hub(DuckDBStore(str(path)))  # a 15-s restart: every rank's last report is old
    reopened.resume(75.0)
    try:
        world.run(reopened, 75, 100)
        assert silence_alerts(reopened) == []
        world.job.dead = {1}
        world.run(reopened, 100, 120)
        assert lost_ranks(reopened) == {"1"}
    finally:
        reopened.store.close()
