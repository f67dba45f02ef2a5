"""A hub reopened on a store whose training job fell silent before the restart: a job that died
while the hub was down (its GPUs still reported allocated to it after the restart, no rank heard)
is one training_stalled a grace period after the restart, not a rank_lost per rank; a job that
ended unsaid (its GPUs freed, or the whole cluster stopped, as a stopped demo's) or said it ended
raises nothing. A rank that does not come back when its job does, or that goes silent after the
restart, is still found."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def first_minute(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, World]:
    """A hub's store after the job reported 0-60 s, closed, and the world as it was then: each test
    reopens its own copy (the same for every test, so it is written once)."""
    folder = tmp_path_factory.mktemp("first-minute")
    world = World()
    hub = Hub(DuckDBStore(str(folder / "hub.duckdb")))
    world.run(hub, 0, 60)
    assert not silence_alerts(hub)
    hub.store.close()
    return folder, world


def after_first_minute(tmp_path: Path, first_minute: tuple[Path, World]) -> tuple[Path, World]:
    """This test's copy of the store and the world of ``first_minute``."""
    folder, world = first_minute
    copied = tmp_path / "hub"
    shutil.copytree(folder, copied)
    return copied / "hub.duckdb", copy.deepcopy(world)


def reopen_after_silence(path: Path, world: World) -> Hub:
    """The job reported 0-60 s, then stops without a word; the hub stopped at 60 s reopens at 75 s."""
    world.job_reports = False
    reopened = Hub(DuckDBStore(str(path)))
    reopened.resume(75.0)
    return reopened


def test_a_job_that_died_while_the_hub_was_down_is_one_stall_after_the_restart(
    tmp_path: Path, first_minute: tuple[Path, World]
) -> None:
    """Seen: a job whose every rank died while the hub was down raised nothing after the restart,
    though its nodes reported its GPUs allocated to it (and idle) for as long as anyone looked."""
    path, world = after_first_minute(tmp_path, first_minute)
    hub = reopen_after_silence(path, world)
    try:
        world.run(hub, 75, 99)  # the nodes report the job's GPUs, still allocated to it
        assert silence_alerts(hub) == []  # within the grace for senders to come back after a restart
        world.run(hub, 99, 200)
        (stalled,) = [a for a in hub.firing() if a.rule in SILENCE_RULES]
        assert stalled.rule == "training_stalled" and stalled.entity == {"job": "pretrain"}
        assert stalled.started_at <= 75 + 26 and stalled.severity == "P1"
        assert "before the hub restarted" in stalled.summary
        assert f"not advanced past step {world.job.step} " in stalled.summary
        assert stalled.details["silent_before_restart"] is True
        assert stalled.details["seconds_since_step"] >= 75 - 60
        stats = hub.detection_stats()
        assert stats.get("jobs_silent_before_start") == 1 and stats.get("jobs_dead_before_start") == 1
        world.job_reports = True  # it comes back after all: the stall resolves
        world.job.dead = set()
        world.run(hub, 200, 230)
        assert [a for a in hub.firing() if a.rule in SILENCE_RULES] == []
    finally:
        hub.store.close()


def test_a_job_whose_gpus_were_freed_raises_nothing_after_the_restart(
    tmp_path: Path, first_minute: tuple[Path, World]
) -> None:
    """It ended unsaid: the scheduler freed its GPUs, which the nodes report idle and unallocated."""
    path, world = after_first_minute(tmp_path, first_minute)
    world.cluster.free(world.job.name)  # at 60 s, while the hub is down
    hub = reopen_after_silence(path, world)
    try:
        world.run(hub, 75, 300)
        assert silence_alerts(hub) == []
        assert hub.detection_stats().get("jobs_silent_before_start") == 1
        assert not hub.detection_stats().get("jobs_dead_before_start")
    finally:
        hub.store.close()


def test_a_store_reopened_with_the_cluster_stopped_raises_nothing(
    tmp_path: Path, first_minute: tuple[Path, World]
) -> None:
    """A stopped demo's store, opened again to look at it: nothing reports, not even the nodes."""
    path, world = after_first_minute(tmp_path, first_minute)
    hub = reopen_after_silence(path, world)
    try:
        for t in range(75, 300):
            hub.evaluate(float(t))
        assert silence_alerts(hub) == []
    finally:
        hub.store.close()


def test_a_job_that_said_it_ended_before_the_restart_raises_nothing(tmp_path: Path) -> None:
    world = World()
    path = tmp_path / "hub.duckdb"
    hub = Hub(DuckDBStore(str(path)))
    world.run(hub, 0, 60)
    ended = world.job.end(60.0)
    hub.ingest(ended)
    hub.evaluate(60.0)
    hub.store.close()
    world.job_reports = False
    reopened = Hub(DuckDBStore(str(path)))
    reopened.resume(75.0)
    try:
        world.run(reopened, 75, 300)  # its GPUs still carry its label: the scheduler is slow to free them
        assert silence_alerts(reopened) == []
    finally:
        reopened.store.close()


def test_a_rank_that_does_not_come_back_with_its_job_is_found(
    tmp_path: Path, first_minute: tuple[Path, World]
) -> None:
    path, world = after_first_minute(tmp_path, first_minute)
    hub = reopen_after_silence(path, world)
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


def test_a_rank_that_goes_silent_after_the_restart_is_found(
    tmp_path: Path, first_minute: tuple[Path, World]
) -> None:
    path, world = after_first_minute(tmp_path, first_minute)
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


def test_a_stall_that_fired_before_the_restart_goes_on_as_the_same_alert(tmp_path: Path) -> None:
    """The hub saw the job die, then restarted: its stall continues (not resolved and fired again,
    which would notify twice); the per-rank rank_lost alerts of the same cause resolve."""
    world = World()
    path = tmp_path / "hub.duckdb"
    hub = Hub(DuckDBStore(str(path)))
    world.run(hub, 0, 60)
    world.job_reports = False
    world.run(hub, 60, 120)  # the job dies while the hub runs
    (before,) = [a for a in hub.firing() if a.rule == "training_stalled"]
    assert lost_ranks(hub) == {"0", "1", "2", "3"}
    hub.store.close()
    reopened = Hub(DuckDBStore(str(path)))
    reopened.resume(130.0)
    try:
        world.run(reopened, 130, 250)
        stalls = [a for a in reopened.alert_view()[0] if a.rule == "training_stalled"]
        assert [(a.id, a.firing) for a in stalls] == [(before.id, True)]
        assert lost_ranks(reopened) == set()
    finally:
        reopened.store.close()
