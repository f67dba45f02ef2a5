"""loss_plateau: a long healthy run whose learning rate drops late stays quiet; a curve that stops
improving is flagged."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.loss import LossDetector
from gpuscope.model import TrainingRecord


def curve(k: int, drop: int, flat_from: int | None) -> float:
    """The shape of a real run: a power law towards 2.1, 3.5 % lower after a learning-rate drop."""
    k = min(k, flat_from) if flat_from is not None else k
    loss = 2.1 + 8.7 * math.pow(1.0 + k / 30.0, -0.55)
    if k > drop:
        loss *= 1.0 - 0.035 * (1.0 - math.exp(-(k - drop) / 60.0))
    return loss


def plateaus(
    hours: float, drop: int, flat_from: int | None = None, seed: int = 0, step: float = 2.0
) -> list[float]:
    """Onsets of loss_plateau over a run of 2 s steps whose loss is the mean of 8 ranks' (noise
    1.2 % per job step, 2 % per rank)."""
    rng = np.random.default_rng(seed)
    detector = LossDetector()
    onsets: list[float] = []
    was = False
    for k in range(int(hours * 3600 / step)):
        ts = k * step
        noise = 0.012 * float(rng.standard_normal()) + 0.02 * float(rng.standard_normal()) / math.sqrt(8)
        loss = curve(k, drop, flat_from) * (1.0 + noise)
        detector.on_training(TrainingRecord(ts, "j", 0, k, {"loss": loss}))
        if k % 5 == 0:
            now = any(f.rule == "loss_plateau" for f in detector.evaluate(ts + 0.5))
            if now and not was:
                onsets.append(ts)
            was = now
    return onsets


def test_a_long_healthy_run_with_a_late_learning_rate_drop_raises_no_plateau() -> None:
    for seed in range(4):
        assert plateaus(6.0, drop=5400, seed=seed) == []


def test_a_curve_that_stops_improving_is_a_plateau() -> None:
    onsets = plateaus(2.5, drop=10**9, flat_from=1400)
    assert len(onsets) == 1 and 2800 < onsets[0] <= 2800 + 1800


def test_a_learning_rate_drop_straddling_the_windows_before_raises_no_plateau() -> None:
    """A fine-tuning curve (towards 1.4, 0.7 s steps) whose drop falls across the boundary of the
    two windows the pace is taken from: the slow pace after it is not a plateau (it fired before)."""
    rng = np.random.default_rng(0)
    detector = LossDetector()
    onsets: list[float] = []
    drop, step = 9000, 0.7
    for k in range(int(2.5 * 3600 / step)):
        ts = k * step
        loss = 1.4 + 1.2 * math.pow(1.0 + k / 30.0, -0.55)
        if k > drop:
            loss *= 1.0 - 0.035 * (1.0 - math.exp(-(k - drop) / 60.0))
        loss *= (
            1.0 + 0.012 * float(rng.standard_normal()) + 0.02 * float(rng.standard_normal()) / math.sqrt(2)
        )
        detector.on_training(TrainingRecord(ts, "ft", 0, k, {"loss": loss}))
        if k % 5 == 0 and any(f.rule == "loss_plateau" for f in detector.evaluate(ts + 0.1)):
            onsets.append(ts)
    assert onsets == []
