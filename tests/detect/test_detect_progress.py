"""Progress: step advances, step-time baseline, checkpoints in flight (shared by job detectors)."""

from __future__ import annotations

import math

from detect.rig import Driver, FakeCluster, FakeJob
from gpuscope.detect.progress import ADVANCED, ROLLED_BACK, Progress
from gpuscope.detect.training import TrainingLivenessDetector
from gpuscope.model import Batch, Event, TrainingRecord


def rec(ts: float, step: int, rank: int = 0, step_seconds: float = 1.0) -> TrainingRecord:
    return TrainingRecord(ts, "llm", rank, step, {"step_seconds": step_seconds})


def test_advances_rank_lag_and_rollback() -> None:
    p = Progress()
    assert not p.started and p.baseline() == 0.0
    assert p.record(rec(10.0, 1)) == ADVANCED and p.started
    assert p.record(rec(10.1, 1, rank=1)) is None  # another rank finishing the same step
    assert p.record(rec(12.0, 3)) == ADVANCED  # two steps in 2 s: one second per step
    assert p.record(rec(12.1, 2, rank=1)) is None  # a late record one step behind
    assert p.record(rec(50.0, 1)) == ROLLED_BACK and p.step == 1
    assert p.intervals.median() == 1.0


def test_baseline_trusts_the_slowest_step_while_warming_up() -> None:
    p = Progress()
    for ts, step in [(0.0, 1), (3.0, 2), (4.0, 3)]:
        p.record(rec(ts, step, step_seconds=math.nan))
    assert p.baseline(warmup_intervals=3) == 3.0  # two intervals: the slower one
    p.record(rec(5.0, 4))
    assert p.baseline(warmup_intervals=3) == 1.0  # three: the median


def test_a_checkpoint_started_with_its_own_step_in_the_same_batch_stays_open() -> None:
    """Events are dispatched before records: the step the checkpoint saves must not close it."""
    p = Progress()
    p.record(rec(99.0, 99))
    p.checkpoint_started(0, 100.0, 100)
    p.record(rec(100.0, 100))  # the checkpointed step, reported after the start
    assert p.in_checkpoint
    assert p.checkpoint_ended(0, 120.0, 20.0, completed=True) and p.longest_checkpoint == 20.0
    p.record(rec(121.0, 101))  # spans the pause: not a step time
    assert p.intervals.median() == 1.0


def test_a_lost_checkpoint_end_is_closed_by_the_next_step_and_ranks_all_count() -> None:
    p = Progress()
    p.checkpoint_started(0, 10.0, 5)
    p.checkpoint_started(1, 10.0, None)
    assert not p.checkpoint_ended(0, 12.0, None, completed=True)  # rank 1 still writing
    assert p.longest_checkpoint == 2.0  # measured from its start when the event has no seconds
    p.record(rec(13.0, 6))
    assert not p.in_checkpoint  # a later step: rank 1's checkpoint is over whatever it said


def test_detector_keeps_the_checkpoint_pause_when_start_and_step_share_a_batch() -> None:
    cluster = FakeCluster(nodes=1, gpus=2)
    job = FakeJob.on(cluster.names, 2)
    driver = Driver([TrainingLivenessDetector()])
    driver.run(0, 50, lambda t: [*cluster.batches(t), job.batch(t)])
    job.hung = True  # the ranks write a checkpoint for 60 s; no steps meanwhile
    step = job.step + 1
    labels = [{"job": "llm", "rank": str(r), "node": "node-0", "gpu": str(r)} for r in range(2)]
    start = Batch(
        "sdk:llm",
        events=[Event(50.0, "checkpoint_started", lb, {"step": step}) for lb in labels],
        training=[rec(50.0, step, rank=r) for r in range(2)],
    )
    done = Batch(
        "sdk:llm",
        events=[Event(110.0, "checkpoint_completed", lb, {"step": step, "seconds": 60.0}) for lb in labels],
    )
    driver.run(
        50,
        116,  # steps would resume after the checkpoint; a stall fires 8 s after it, not before
        lambda t: [*cluster.batches(t), job.batch(t), start if t == 50 else None, done if t == 110 else None],
    )
    assert not driver.alerts.all()
