"""loss_plateau: a long healthy run whose learning rate drops late stays quiet; a curve that stops
improving is flagged, a ten-minute plateau in a half-hour job too; healthy young curves (a
learning-rate drop, a recovered spike, noise correlated over minutes, few or many ranks) stay
quiet."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.loss import LossDetector
from gpuscope.model import TrainingRecord


def curve(k: int, drop: int, flat_from: int | None, flat_to: int | None = None) -> float:
    """The shape of a real run: a power law towards 2.1, 3.5 % lower after a learning-rate drop."""
    if flat_from is not None and (flat_to is None or k < flat_to):
        k = min(k, flat_from)
    loss = 2.1 + 8.7 * math.pow(1.0 + k / 30.0, -0.55)
    if k > drop:
        loss *= 1.0 - 0.035 * (1.0 - math.exp(-(k - drop) / 60.0))
    return loss


def plateaus(
    hours: float,
    drop: int,
    flat_from: int | None = None,
    seed: int = 0,
    step: float = 2.0,
    *,
    flat_to: int | None = None,
    ranks: int = 8,
    wander: float = 0.0,
    wander_steps: float = 100.0,
    spike_at: int | None = None,
) -> list[float]:
    """Onsets of loss_plateau over a run of 2 s steps whose loss is the mean of 8 ranks' (noise
    1.2 % per job step, 2 % per rank), plus ``wander``: noise correlated over ``wander_steps``
    (an AR(1) walk, as data order or a slow shift of the mix makes), and a spike (3x, decaying
    over 40 steps) at ``spike_at``."""
    rng = np.random.default_rng(seed)
    detector = LossDetector()
    onsets: list[float] = []
    was = False
    keep = math.exp(-1.0 / wander_steps)
    walk = 0.0
    for k in range(int(hours * 3600 / step)):
        ts = k * step
        walk = keep * walk + math.sqrt(1.0 - keep * keep) * float(rng.standard_normal())
        noise = 0.012 * float(rng.standard_normal()) + 0.02 * float(rng.standard_normal()) / math.sqrt(ranks)
        loss = curve(k, drop, flat_from, flat_to) * (1.0 + noise + wander * walk)
        if spike_at is not None and k >= spike_at:
            loss *= 1.0 + 2.0 * math.exp(-(k - spike_at) / 40.0)
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


def test_a_ten_minute_plateau_in_a_half_hour_job_is_found() -> None:
    """Flat from 900 s for 600 s (1.5 s steps) in a job 30 minutes old at the end: the long test
    needs 2700 s of history; the short one finds it within the plateau, and lets go after."""
    onsets = plateaus(0.5, drop=10**9, flat_from=600, flat_to=1000, step=1.5)
    assert len(onsets) == 1 and 900 + 300 <= onsets[0] <= 1500


def test_a_plateau_on_a_one_rank_job_with_quick_steps_is_found() -> None:
    onsets = plateaus(0.5, drop=10**9, flat_from=2000, step=0.5, ranks=1)
    assert len(onsets) == 1 and 1000 + 300 <= onsets[0] <= 1000 + 600


def test_young_healthy_curves_raise_no_plateau() -> None:
    """The first hour, where the short test judges: quick and slow steps, one rank or many, a
    learning-rate drop early, mid-run and late, a spike that recovers."""
    for seed, (step, ranks, drop) in enumerate(
        [(0.5, 1, 10**9), (1.5, 8, 10**9), (2.0, 1, 400), (1.0, 8, 1200), (0.6, 64, 3000), (5.0, 64, 300)]
    ):
        assert plateaus(1.0, drop=drop, seed=seed, step=step, ranks=ranks) == [], (step, ranks, drop)
    for spike_at in (500, 900, 1300):
        assert plateaus(1.0, drop=10**9, step=1.5, spike_at=spike_at) == [], spike_at


def test_noise_correlated_over_minutes_raises_no_plateau() -> None:
    """A 1 % wander over 100 and 400 steps (2.5 and 10 minutes at 1.5 s) on top of the step
    noise, over two hours."""
    for seed, wander_steps in enumerate((100.0, 400.0, 100.0, 400.0)):
        onsets = plateaus(2.0, drop=10**9, seed=seed, step=1.5, wander=0.01, wander_steps=wander_steps)
        assert onsets == [], (seed, wander_steps)


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
