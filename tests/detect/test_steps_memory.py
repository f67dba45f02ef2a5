"""The step gatherer holds a bounded number of training jobs: ended jobs do not pile up for months."""

from __future__ import annotations

import pytest

from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.steps import StepGatherer
from gpuscope.model import Batch, TrainingRecord


def record(job: str, step: int, ts: float, rank: int = 0) -> TrainingRecord:
    return TrainingRecord(ts, job, rank, step, {"loss": 2.0, "step_seconds": 1.0})


def test_past_max_jobs_the_jobs_not_heard_from_longest_are_forgotten_and_counted() -> None:
    steps = StepGatherer(max_jobs=100)
    for i in range(1000):  # a thousand short jobs one after the other, and one that runs throughout
        steps.add(record(f"job-{i}", 1, float(i)))
        steps.add(record("long-runner", i, float(i)))
    assert len(steps.jobs) <= 100
    assert steps.forgotten == 1001 - len(steps.jobs)
    assert "long-runner" in steps.jobs and "job-999" in steps.jobs and "job-0" not in steps.jobs
    closed = [v for v in steps.closed() if v.job == "long-runner"]
    assert [v.step for v in closed] == list(range(1000 - 64, 1000))  # its open steps are intact


def test_the_engine_counts_forgotten_jobs() -> None:
    engine = DetectionEngine()
    engine.feeds.steps.max_jobs = 10
    for i in range(50):
        engine.observe(Batch(f"sdk:job-{i}", training=[record(f"job-{i}", 1, 1000.0 + i)]))
        engine.evaluate(1000.0 + i)
    assert len(engine.feeds.steps.jobs) <= 10
    assert engine.counters.get("training_jobs_forgotten") == 50 - len(engine.feeds.steps.jobs)


def test_max_jobs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_jobs"):
        StepGatherer(max_jobs=0)
