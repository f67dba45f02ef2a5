"""Silence judged against the fleet's event-time watermark: when the hub (or the network, or a
load generator) falls behind, every sender's data arrives late and in turns, so on the hub's
clock each one is silent for a while; none of them is lost. A sender that really stopped is
still found, and a fleet that went silent altogether is the hub's gap, not per-node pages."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from detect.rig import Driver, FakeCluster, FakeJob
from gpuscope.detect.presence import NodeUnreachableDetector
from gpuscope.detect.training import TrainingLivenessDetector
from gpuscope.model import Batch

NODES, JOBS = 16, 4
LOST = {"node_unreachable", "rank_lost"}


class Fleet:
    """16 nodes and 4 training jobs (4 nodes x 2 GPUs each), one batch per sender a second,
    through a FIFO intake of limited rate: what the senders produced waits its turn, as behind a
    hub that is behind or a fair connection pool."""

    def __init__(self) -> None:
        self.cluster = FakeCluster(nodes=NODES, gpus=2)
        names = self.cluster.names
        self.jobs = [FakeJob.on(names[4 * j : 4 * j + 4], 2, name=f"job-{j}") for j in range(JOBS)]
        for job in self.jobs:
            self.cluster.allocate(job.name, job.placement)
        self.driver = Driver([NodeUnreachableDetector(), TrainingLivenessDetector()])
        self.queue: deque[Batch] = deque()
        self.rate: int | None = None  # batches the intake passes per second; None: all at once
        self.delivered: dict[str, float] = {}  # sender -> hub time its newest batch got through

    def produce(self, t: float) -> list[Batch | None]:
        return [*self.cluster.batches(t), *(job.batch(t) for job in self.jobs)]

    def intake(self, t: float) -> list[Batch | None]:
        self.queue.extend(b for b in self.produce(t) if b is not None)
        n = len(self.queue) if self.rate is None else min(self.rate, len(self.queue))
        out: list[Batch | None] = [self.queue.popleft() for _ in range(n)]
        for batch in out:
            assert batch is not None
            self.delivered[batch.source] = t
        return out

    def run(
        self, start: float, stop: float, make: Callable[[float], list[Batch | None]] | None = None
    ) -> None:
        self.driver.run(start, stop, make or self.intake)

    def stat(self, name: str) -> int:
        return self.driver.detection.stats().get(name, 0)


def lost(fleet: Fleet) -> list[str]:
    return [f"{a.rule} {a.entity}" for a in fleet.driver.alerts_of() if a.rule in LOST]


def test_a_backlog_delivered_late_and_in_turns_raises_nothing() -> None:
    fleet = Fleet()
    fleet.run(0, 60)
    fleet.rate = 4  # 20 senders, 4 batches a second: each sender heard every ~5 s, ever later
    fleet.run(60, 150)
    assert not lost(fleet)
    # the intake was slow enough that, on the hub's clock alone, senders looked silent
    assert fleet.stat("node_verdicts_withheld_watermark") > 0
    assert fleet.stat("rank_verdicts_withheld_watermark") > 0
    node_stats = fleet.driver.detection.detectors[0]
    assert isinstance(node_stats, NodeUnreachableDetector)
    assert node_stats.stats()["watermark_lag_seconds"] > 30  # the fleet's data arrives that late
    fleet.rate = 100  # the hub catches up: the backlog arrives in a burst
    fleet.run(150, 200)
    fleet.rate = None
    fleet.run(200, 240)
    assert not fleet.queue
    assert not lost(fleet)
    assert not fleet.driver.serious()  # nor a stall: every job kept stepping, only late


def test_a_dead_node_among_live_ones_is_found_in_its_usual_time() -> None:
    fleet = Fleet()
    fleet.run(0, 50)
    fleet.cluster.down.add("node-5")  # its last report is stamped 49
    fleet.run(50, 80)
    alert = fleet.driver.only("node_unreachable")
    assert alert.entity == {"node": "node-5"} and alert.severity == "P1"
    assert 52 <= alert.started_at <= 54  # silence >= max(4 x 1 s, 4 s) since 49, as without a watermark
    assert alert.details["event_silence_seconds"] >= 4


def test_a_node_that_dies_while_the_fleet_is_late_is_found_once_the_fleet_passes_it() -> None:
    fleet = Fleet()
    fleet.run(0, 60)
    fleet.rate = 4
    fleet.run(60, 70)
    fleet.cluster.down.add("node-5")  # produces nothing from 70 on; its backlog still arrives
    fleet.run(70, 160)
    alert = fleet.driver.only("node_unreachable")
    assert alert.entity == {"node": "node-5"}
    assert alert.started_at > fleet.delivered["node-5"] + 4
    # found when the fleet's watermark is 4 s of event time past its last report: late by no
    # more than what the fleet lags (the intake passes 1 s of the fleet's time every 5 s)
    assert alert.details["event_silence_seconds"] >= 4
    assert alert.details["watermark_lag_seconds"] > 0
    assert alert.started_at <= fleet.delivered["node-5"] + 5 * 4 + 10
    assert [a.entity for a in fleet.driver.alerts_of("node_unreachable")] == [{"node": "node-5"}]


def test_a_hung_job_is_still_a_stall_and_a_dead_rank_still_lost_while_the_fleet_is_late() -> None:
    fleet = Fleet()
    fleet.run(0, 60)
    fleet.rate = 4
    fleet.jobs[1].hung = True  # heartbeats go on, steps stop
    fleet.jobs[2].dead.add(3)  # one rank's process died: no heartbeats from it
    fleet.run(60, 200)
    stalls = {a.entity["job"] for a in fleet.driver.alerts_of("training_stalled")}
    assert "job-1" in stalls
    lost_ranks = [(a.entity["job"], a.entity["rank"]) for a in fleet.driver.alerts_of("rank_lost")]
    assert lost_ranks == [("job-2", "3")]
    assert not fleet.driver.alerts_of("node_unreachable")


def test_the_whole_fleet_silent_is_the_hubs_gap_not_pages_for_every_node() -> None:
    fleet = Fleet()
    fleet.run(0, 60)
    fleet.run(60, 120, lambda t: [])  # the hub is isolated: nothing arrives, it keeps evaluating
    fleet.run(120, 180, fleet.produce)
    assert not lost(fleet)
    assert fleet.stat("node_verdicts_withheld_hub_gap") > 0
    assert fleet.stat("rank_verdicts_withheld_hub_gap") > 0
