"""The loss and checkpoint detectors forget a job's state a retention after it ended, counted."""

from __future__ import annotations

from gpuscope.detect.base import Feeds
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.lifecycle import LifecycleDetector
from gpuscope.detect.loss import LossDetector
from gpuscope.detect.training import TrainingLivenessDetector
from gpuscope.model import Batch, Event, TrainingRecord


def _lifecycle(kind: str, job: str, ts: float) -> Event:
    return Event(ts, kind, {"job": job}, {"kind": "training", "world_size": 2})


def _checkpoint(job: str, ts: float, step: int) -> list[Event]:
    return [
        Event(ts, kind, {"job": job, "rank": str(rank)}, {"step": step})
        for kind in ("checkpoint_started", "checkpoint_completed")
        for rank in range(2)
    ]


def _train(det: LossDetector, job: str, start: int, steps: int) -> None:
    for step in range(start, start + steps):
        for rank in range(2):
            det.on_training(TrainingRecord(float(step), job, rank, step, {"loss": 1.0 / (step + 1)}))
        det.evaluate(float(step))


def test_the_loss_detector_forgets_a_job_an_hour_after_it_ended() -> None:
    det = LossDetector(finished_job_retention_s=3600.0)
    for job in ("a", "b"):
        det.on_event(_lifecycle("job_started", job, 0.0))
    _train(det, "a", 0, 50)
    _train(det, "b", 0, 50)
    det.on_event(_lifecycle("job_ended", "a", 50.0))
    det.on_event(_lifecycle("job_failed", "b", 50.0))
    det.evaluate(3000.0)
    assert set(det._jobs) == {"a", "b"}  # within the retention
    det.evaluate(3700.0)
    assert det._jobs == {}
    assert det.counters.get("loss_jobs_forgotten") == 2


def test_the_loss_detector_keeps_a_running_job_and_one_that_restarted() -> None:
    det = LossDetector(finished_job_retention_s=60.0)
    det.on_event(_lifecycle("job_started", "a", 0.0))
    _train(det, "a", 0, 30)
    det.on_event(_lifecycle("job_failed", "a", 30.0))
    det.on_event(_lifecycle("job_started", "a", 40.0))  # restarted: running again
    _train(det, "a", 30, 10)
    det.evaluate(10_000.0)
    assert set(det._jobs) == {"a"}
    assert det.counters.get("loss_jobs_forgotten") == 0


def test_the_checkpoint_detector_forgets_a_finished_job_after_the_retention() -> None:
    det = LifecycleDetector(finished_job_retention_s=3600.0)
    for job in ("a", "b"):
        det.on_event(_lifecycle("job_started", job, 0.0))
        for k in range(3):
            for event in _checkpoint(job, 100.0 * (k + 1), 10 * (k + 1)):
                det.on_event(event)
    det.on_event(_lifecycle("job_ended", "a", 400.0))
    det.evaluate(3900.0)
    assert set(det._ckpt) == {"a", "b"}
    det.evaluate(4100.0)
    assert set(det._ckpt) == {"b"}  # b still runs: its checkpoint interval stays learned
    assert det.counters.get("checkpoint_jobs_forgotten") == 1
    # b is overdue by then, as before: forgetting a did not touch it
    assert [f.entity for f in det.evaluate(4200.0) if f.rule == "checkpoint_overdue"] == [{"job": "b"}]


def test_a_failed_jobs_alert_holds_its_hold_whatever_the_retention() -> None:
    det = LifecycleDetector(hold=1800.0, finished_job_retention_s=60.0, settle=0.0)
    det.on_event(_lifecycle("job_started", "a", 0.0))
    det.on_event(Event(10.0, "checkpoint_failed", {"job": "a", "rank": "0"}, {"step": 5, "reason": "disk"}))
    det.on_event(Event(20.0, "job_failed", {"job": "a"}, {"reason": "oom"}))
    rules = {f.rule for f in det.evaluate(1000.0)}
    assert rules == {"job_failed", "checkpoint_failed"}
    assert det.evaluate(1900.0) == []
    det.evaluate(2000.0)
    assert det._ckpt == {}


def test_a_job_that_never_saves_its_first_checkpoint_is_overdue_by_its_declared_interval() -> None:
    det = LifecycleDetector()
    declared = {"kind": "training", "world_size": 2, "checkpoint_every": 300}
    det.on_event(Event(0.0, "job_started", {"job": "a"}, declared))
    det.on_event(_lifecycle("job_started", "b", 0.0))  # declared none: nothing to be overdue against

    def overdue(now: float) -> list[str]:
        return [f.summary for f in det.evaluate(now) if f.rule == "checkpoint_overdue"]

    assert overdue(599.0) == []
    (summary,) = overdue(600.0)
    assert "job a" in summary.lower() and "every 300 s" in summary and "none since it started" in summary
    # one good checkpoint: the clock starts again from it
    for event in _checkpoint("a", 650.0, 40):
        det.on_event(event)
    assert overdue(1200.0) == [] and len(overdue(1250.0)) == 1
    # a restart declares again and starts the clock again
    det.on_event(Event(1300.0, "job_started", {"job": "a"}, declared))
    assert overdue(1850.0) == [] and len(overdue(1900.0)) == 1


def test_a_stalled_job_is_not_overdue_by_its_declared_interval() -> None:
    # the steps the heartbeats told are the engine's feeds, which the liveness detector feeds
    det, liveness, feeds = LifecycleDetector(), TrainingLivenessDetector(), Feeds(GpuTable(()))
    det.attach(feeds)
    liveness.attach(feeds)
    start = Event(0.0, "job_started", {"job": "a"}, {"world_size": 1, "checkpoint_every": 300})
    for t in range(0, 1000, 10):  # training until 200 s, then stuck at step 200 (a dead peer, a hang)
        for event in ([start] if t == 0 else []) + [
            Event(float(t), "heartbeat", {"job": "a", "rank": "0"}, {"step": min(t, 200)})
        ]:
            det.on_event(event)
            liveness.on_event(event)
    assert [f for f in det.evaluate(999.0) if f.rule == "checkpoint_overdue"] == []
    # the same job advancing again: overdue by its declared interval
    advancing = Event(995.0, "heartbeat", {"job": "a", "rank": "0"}, {"step": 201})
    det.on_event(advancing)
    liveness.on_event(advancing)
    assert [f.entity for f in det.evaluate(1000.0) if f.rule == "checkpoint_overdue"] == [{"job": "a"}]


def test_in_an_engine_the_checkpoint_detector_reads_the_steps_the_liveness_detector_follows() -> None:
    checkpoints, liveness = LifecycleDetector(), TrainingLivenessDetector()
    engine = DetectionEngine([checkpoints, liveness])
    start = Event(0.0, "job_started", {"job": "a"}, {"world_size": 1, "checkpoint_every": 300})
    engine.observe(Batch("sdk", events=[start]))
    for t in range(0, 1000, 10):  # training until 200 s, then stuck at step 200
        engine.observe(
            Batch(
                "sdk", events=[Event(float(t), "heartbeat", {"job": "a", "rank": "0"}, {"step": min(t, 200)})]
            )
        )
    assert liveness.told is checkpoints._told and liveness.told.told("a") == (200, 200.0)
    assert [f for f in engine.evaluate(999.0) if f.rule == "checkpoint_overdue"] == []
    # the same job advancing: overdue by its declared interval, as on its own
    engine.observe(Batch("sdk", events=[Event(995.0, "heartbeat", {"job": "a", "rank": "0"}, {"step": 201})]))
    assert [f.entity for f in engine.evaluate(1000.0) if f.rule == "checkpoint_overdue"] == [{"job": "a"}]
