"""The engine: registry, dispatch, isolation of a failing detector, refusal of broken input."""

from __future__ import annotations

import math

import numpy as np

from detect.rig import Driver, FakeCluster, FakeJob
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine, load_detectors
from gpuscope.detect.frames import view
from gpuscope.model import Batch, Event, Finding, Frame, TrainingRecord
from gpuscope.rules import RULES


class Recorder(Detector):
    rules = ("gpu_lost",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_frame(self, frame: Frame) -> None:
        self.seen.append(f"frame@{frame.ts}")

    def on_event(self, event: Event) -> None:
        self.seen.append(event.kind)

    def on_training(self, record: TrainingRecord) -> None:
        self.seen.append(f"step{record.step}")

    def evaluate(self, now: float) -> list[Finding]:
        return [Finding("gpu_lost", {"node": "n", "gpu": "0"}, f"seen {len(self.seen)}")]


class Broken(Detector):
    def on_frame(self, frame: Frame) -> None:
        raise RuntimeError("boom")

    def evaluate(self, now: float) -> list[Finding]:
        raise RuntimeError("boom")


def test_every_registered_detector_is_loaded_and_names_catalog_rules() -> None:
    registry = load_detectors()
    assert {
        "XidDetector",
        "EccDetector",
        "GpuLostDetector",
        "NodeUnreachableDetector",
        "ThermalThrottleDetector",
        "TrainingLivenessDetector",
    } <= set(registry)
    engine = DetectionEngine()
    assert len(engine.detectors) == len(registry)
    rules = {rule for d in engine.detectors for rule in d.rules}
    assert rules <= set(RULES)
    assert {
        "gpu_xid_fatal",
        "gpu_xid_app",
        "gpu_ecc_uncorrectable",
        "gpu_lost",
        "node_unreachable",
        "gpu_thermal_throttle",
        "training_stalled",
        "rank_lost",
    } <= rules


def test_dispatch_order_and_a_failing_detector_does_not_blind_the_others() -> None:
    recorder = Recorder()
    engine = DetectionEngine([Broken(), recorder])
    frame = Frame(1.0, ["gpu_temp_celsius"], [{"node": "n", "gpu": "0"}], np.array([[50.0]]))
    engine.observe(
        Batch(
            "n",
            frames=[frame],
            events=[Event(1.0, "xid", {}, {})],
            training=[TrainingRecord(1.0, "j", 0, 7, {})],
        )
    )
    findings = engine.evaluate(2.0)
    assert recorder.seen == ["frame@1.0", "xid", "step7"]
    assert [f.summary for f in findings] == ["seen 3"]
    stats = engine.stats()
    assert stats["detect_errors_Broken_on_frame"] == 1 and stats["detect_errors_Broken_evaluate"] == 1


def test_broken_frames_and_timestamps_are_refused_and_counted() -> None:
    recorder = Recorder()
    engine = DetectionEngine([recorder])
    bad_shape = Frame(1.0, ["a", "b"], [{"node": "n", "gpu": "0"}], np.zeros((1, 3)))
    bad_ts = Frame(math.nan, ["a"], [{"node": "n"}], np.zeros((1, 1)))
    unplaced = Frame(1.0, ["a"], [{"gpu": "0"}], np.zeros((1, 1)))
    engine.observe(
        Batch(
            "x",
            frames=[bad_shape, bad_ts, unplaced],
            events=[Event(math.inf, "xid", {})],
            training=[TrainingRecord(math.nan, "j", 0, 1, {})],
        )
    )
    stats = engine.stats()
    assert stats["detect_frames_refused"] == 2 and stats["detect_events_refused"] == 1
    assert stats["detect_training_refused"] == 1 and stats["detect_gpu_rows_without_node"] == 1
    assert recorder.seen == ["frame@1.0"]
    try:
        engine.evaluate(math.nan)
    except ValueError as exc:
        assert "finite" in str(exc)
    else:
        raise AssertionError("a NaN evaluation time must be refused")


def test_frame_view_roles() -> None:
    entities = [
        {"node": "a", "gpu": "1", "job": "j"},
        {"node": "a"},
        {"service": "s", "node": "a", "model": "m", "version": "v"},
        {"node": "b", "gpu": "0"},
    ]
    values = np.array([[1.0, np.nan], [2.0, 3.0], [4.0, 5.0], [np.nan, np.nan]])
    v = view(Frame(5.0, ["x", "y"], entities, values))
    assert v.gpu_keys == [("a", "1"), ("b", "0")] and v.gpu_jobs == ["j", None]
    assert v.node_rows == {"a": 1} and v.nodes == ["a", "b"]
    assert v.gpu_alive() == [True, False]
    column = v.gpu_column("x")
    assert column is not None and column[0] == 1.0 and math.isnan(column[1])
    assert v.gpu_column("missing") is None


def test_nan_and_missing_values_everywhere_never_crash_any_detector() -> None:
    cluster = FakeCluster(nodes=2, gpus=4)
    job = FakeJob.on(cluster.names, 4)
    cluster.allocate(job.name, job.placement)
    nan = float("nan")
    driver = Driver()

    def ticks(t: float) -> list[Batch | None]:
        if t == 20:  # GPUs seen healthy so far start answering nothing, or NaN in every metric
            for g in range(4):
                cluster.overrides[("node-0", str(g))] = dict.fromkeys(cluster.metrics, nan)
            cluster.blank.add(("node-1", "0"))
        batches: list[Batch | None] = [*cluster.batches(t), job.batch(t)]
        odd = Batch(
            "odd",
            frames=[
                Frame(t, [], [], np.zeros((0, 0))),
                Frame(t, ["gpu_temp_celsius"], [{"node": "node-1", "gpu": "9"}], np.array([[nan]])),
            ],
            events=[
                Event(t, "xid", {"node": "node-1", "gpu": "1"}, {"code": None}),
                Event(t, "ecc_dbe", {"node": "node-1", "gpu": "1"}, {"count": "x"}),
                Event(t, "heartbeat", {"job": "llm", "rank": "zero"}),
                Event(t, "checkpoint_completed", {"job": "llm", "rank": "1"}, {"seconds": nan}),
            ],
            training=[TrainingRecord(t, "llm", 0, job.step, {"loss": nan, "step_seconds": math.inf})],
        )
        return [*batches, odd if t >= 20 else None]

    driver.run(0, 60, ticks)
    stats = driver.detection.stats()
    assert not any(name.startswith("detect_errors") for name in stats), stats
    # GPUs that answer nothing at all are lost; nothing else fires on missing data (a NaN *loss*
    # is not missing data: the rank sent it, and it is what loss_nan is for)
    lost = {(a.entity["node"], a.entity["gpu"]) for a in driver.alerts_of("gpu_lost")}
    assert lost == {("node-0", "0"), ("node-0", "1"), ("node-0", "2"), ("node-0", "3"), ("node-1", "0")}
    others = {a.rule for a in driver.alerts.all()} - {
        "gpu_lost",
        "gpu_xid_app",
        "gpu_ecc_uncorrectable",
        "loss_nan",
    }
    assert not others, others
