"""The model-quality rules on the quality monitor's series: drift per signal, business metric drops."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.detect.business import BusinessDetector
from gpuscope.detect.drift import DriftDetector
from gpuscope.model import Batch, Event, Frame
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.sketch import NumericSketch

LABELS = {"service": "chat", "model": "chat", "version": "v7", "node": "node-0"}


def drift_frame(ts: float, signal: str, feature: str, score: float, drifted: float) -> Frame:
    return Frame(
        ts,
        [f"model_{signal}_drift_score", f"model_{signal}_drifted"],
        [LABELS | {"feature": feature}],
        np.array([[score, drifted]]),
    )


def test_drift_fires_when_material_and_sustained_and_clears() -> None:
    det = DriftDetector(min_score=0.2, sustain=300.0)
    fired = []
    for k in range(1, 40):
        ts = 30.0 * k
        score = 0.35 if 300 <= ts < 900 else 0.04
        det.on_frame(drift_frame(ts, "input", "prompt_tokens", score, float(score > 0.1)))
        det.on_frame(drift_frame(ts, "input", "language", 0.15, 1.0))  # drifted, but not material
        fired.append((ts, det.evaluate(ts)))
    firing = [ts for ts, found in fired if found]
    # 0.35 is 1.75 times min_score: held 300 / 1.75 = 171 s, the first sketch after it at 480 s
    assert firing == [ts for ts in range(480, 900, 30)]
    (finding,) = dict(fired)[600.0]
    assert finding.rule == "input_drift"
    assert finding.entity == {"service": "chat", "model": "chat", "version": "v7"}
    assert (
        finding.details["features"] == {"prompt_tokens": 0.35} and "prompt_tokens (0.35)" in finding.summary
    )


def test_each_signal_has_its_rule_and_silence_resolves() -> None:
    det = DriftDetector(sustain=0.0, stale=120.0)
    det.on_frame(drift_frame(10.0, "prediction", "prediction", 0.3, 1.0))
    det.on_frame(drift_frame(10.0, "confidence", "confidence", 0.5, 1.0))
    assert sorted(f.rule for f in det.evaluate(10.0)) == ["confidence_shift", "prediction_drift"]
    assert det.evaluate(200.0) == []  # the service stopped sending sketches


def test_drift_rows_without_service_or_values_are_counted() -> None:
    det = DriftDetector()
    det.on_frame(Frame(1.0, ["model_input_drift_score"], [{"feature": "x"}], np.array([[0.5]])))
    det.on_frame(drift_frame(1.0, "input", "x", float("nan"), 1.0))
    assert det.counters.get("drift_rows_refused") == 2 and det.evaluate(1.0) == []
    with pytest.raises(ValueError):
        DriftDetector(min_score=0.0)


def test_a_strong_drift_is_held_for_less_a_mild_one_for_sustain_and_a_blip_not_at_all() -> None:
    def first_firing(scores: dict[float, float]) -> float | None:
        det = DriftDetector(min_score=0.2, sustain=300.0)  # min_hold 120 s
        for k in range(1, 60):
            ts = 30.0 * k
            score = scores.get(ts, 0.04)
            det.on_frame(drift_frame(ts, "prediction", "prediction", score, float(score > 0.1)))
            if det.evaluate(ts):
                return ts
        return None

    # a drift of five minutes at twice the material score: material for 240 s, found after 150 s
    assert first_firing({300.0 + 30 * k: 0.4 for k in range(8)}) == 450.0
    # at the material score itself it still takes sustain, and 240 s of it is not enough
    assert first_firing({300.0 + 30 * k: 0.2 for k in range(20)}) == 600.0
    assert first_firing({300.0 + 30 * k: 0.2 for k in range(8)}) is None
    # however strong, two minutes at least: three windows of a perfect score are a blip
    assert first_firing({300.0 + 30 * k: 1.0 for k in range(4)}) is None
    assert first_firing({300.0 + 30 * k: 1.0 for k in range(5)}) == 420.0


def prompt_run(factors: list[float], seed: int) -> tuple[QualityMonitor, list[float], list[float]]:
    """400 prompt lengths a window through the monitor and the rule: (monitor, scores, firing times)."""
    rng = np.random.default_rng(seed)
    monitor, det = QualityMonitor(), DriftDetector()
    labels = LABELS | {"signal": "input", "feature": "prompt_tokens"}
    scores, firing = [], []
    for k, factor in enumerate(factors, start=1):
        ts = 30.0 * k
        sk = NumericSketch()
        sk.extend(np.round(rng.lognormal(np.log(400.0 * factor), 0.6, 400)))
        event = Event(ts, "quality_sketch", labels, {"sketch": sk.to_json()})
        derived = monitor.observe(Batch("sdk:chat", events=[event]))
        for f in derived.frames if derived else []:
            det.on_frame(f)
            scores.append(float(f.values[0, f.metrics.index("model_input_drift_score")]))
        if det.evaluate(ts):
            firing.append(ts)
    return monitor, scores, firing


def test_a_drift_while_the_reference_learns_is_not_learned_as_normal() -> None:
    # prompts 1.6 times longer from the third window on: the first 1000 observations (three
    # windows) would hold one drifted window, and the drift would score about 0.4 against them
    monitor, scores, firing = prompt_run([1.0, 1.0] + [1.6] * 30, seed=5)
    assert min(scores) > 0.7  # judged against the two clean windows only
    assert firing and firing[0] <= 90.0 + 150.0 and firing[-1] == 960.0
    assert monitor.counters.get("quality_references_cut_short") == 1


def test_healthy_windows_and_a_lone_odd_one_are_learned_and_stay_quiet() -> None:
    monitor, scores, firing = prompt_run([1.0] * 40, seed=6)
    assert monitor.counters.get("quality_references_cut_short") == 0 and firing == []
    assert len(scores) == 37 and max(scores) < 0.15
    monitor, scores, firing = prompt_run([1.0, 1.0, 1.6, 1.0] + [1.0] * 30, seed=7)
    assert monitor.counters.get("quality_references_cut_short") == 0 and firing == []


def business_run(values: list[float], det: BusinessDetector, every: float = 60.0) -> list[float]:
    """Feed reports through the real quality monitor; the times at which the rule holds."""
    monitor = QualityMonitor()
    firing = []
    for k, value in enumerate(values, start=1):
        ts = every * k
        frame = Frame(ts, ["model_business_metric"], [LABELS | {"metric": "ctr"}], np.array([[value]]))
        derived = monitor.observe(Batch("sdk:chat", frames=[frame]))
        assert derived is not None
        for f in derived.frames:
            det.on_frame(f)
        if det.evaluate(ts):
            firing.append(ts)
    return firing


def test_business_drop_fires_on_a_lasting_drop_against_a_frozen_baseline() -> None:
    rng = np.random.default_rng(1)
    values = [0.1 * (1 + 0.02 * rng.standard_normal()) * (0.7 if 30 <= k < 90 else 1.0) for k in range(120)]
    firing = business_run(values, BusinessDetector())
    # onset at report 30 (t = 1860 s): two reports to move the 3-report mean, then 90 s held
    assert firing[0] <= 1860 + 240 and firing[-1] < 91 * 60 + 240
    assert len(firing) > 50  # the monitor's baseline learns the drop; the frozen reference does not
    assert BusinessDetector().evaluate(0.0) == []  # a fresh detector has nothing to say


def test_a_business_drop_in_the_warm_up_is_found_once_warm_not_learned_as_normal() -> None:
    rng = np.random.default_rng(3)
    values = [0.1 * (1 + 0.02 * rng.standard_normal()) * (0.7 if k >= 2 else 1.0) for k in range(40)]
    firing = business_run(values, BusinessDetector())
    # onset at the third report (t = 180 s), inside the warm-up (600 s from the first report, at
    # 60 s): the drop has held for far longer than ``sustain`` by then, so the rule holds at the
    # first report once warm (660 s), not 90 s of a new pending later, and for as long as it lasts
    assert firing and firing[0] == 660.0
    assert len(firing) == 30


def test_business_noise_raises_the_bar_and_healthy_noise_stays_quiet() -> None:
    rng = np.random.default_rng(2)
    noisy = [0.1 * (1 + 0.1 * rng.standard_normal()) for _ in range(600)]
    assert business_run(noisy, BusinessDetector()) == []
    det = BusinessDetector()
    det.on_frame(
        Frame(
            1.0,
            ["model_business_metric_baseline", "model_business_metric_ratio"],
            [LABELS],
            np.array([[0.0, 1.0]]),
        )
    )
    assert det.counters.get("business_rows_refused") == 1
