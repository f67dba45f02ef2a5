"""loss_plateau: a long healthy run whose learning rate drops late stays quiet; a curve that stops
improving is flagged, a ten-minute plateau in a half-hour job too, and one that starts in a job's
first minutes; healthy young curves (power laws, exponentials, a learning-rate warm-up or drop, a
recovered spike, noise correlated over minutes, few or many ranks, resumed jobs) stay quiet."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


def young_onsets(
    shape: Callable[[int], float],
    seconds: float,
    step: float,
    *,
    seed: int = 0,
    ranks: int = 8,
    noise: float = 0.012,
    first: int = 0,
    restart_at: float | None = None,
    back: int = 0,
) -> list[float]:
    """Onsets of loss_plateau on a job whose loss at its ``i``-th step is ``shape(i)`` times the
    noise of ``plateaus``, steps numbered from ``first``; at ``restart_at`` the job restarts from
    ``back`` steps earlier a minute later (a restart from a checkpoint)."""
    rng = np.random.default_rng(seed)
    detector = LossDetector()
    onsets: list[float] = []
    was = False
    ts, k, i = 0.0, first, 0
    while ts < seconds:
        if restart_at is not None and ts >= restart_at:
            restart_at, k, ts = None, k - back, ts + 60.0
        jitter = noise * float(rng.standard_normal()) + 0.02 * float(rng.standard_normal()) / math.sqrt(ranks)
        detector.on_training(TrainingRecord(ts, "j", 0, k, {"loss": shape(k - first) * (1.0 + jitter)}))
        if i % 5 == 0:
            now = any(f.rule == "loss_plateau" for f in detector.evaluate(ts + 0.5))
            if now and not was:
                onsets.append(ts)
            was = now
        ts, k, i = ts + step, k + 1, i + 1
    return onsets


def power(k: float) -> float:
    return 2.1 + 8.7 * math.pow(1.0 + k / 30.0, -0.55)


def flat_from(stop: int) -> Callable[[int], float]:
    return lambda k: power(min(k, stop))


def late(k: int) -> float:
    """Late in the curve: a job resumed at step 20,000."""
    return power(20_000 + k)


def transient(curve: Callable[[int], float]) -> Callable[[int], float]:
    """15 % higher at the first step, decaying over 10 steps."""
    return lambda k: curve(k) * (1.0 + 0.15 * math.exp(-k / 10.0))


def lr_drop(curve: Callable[[int], float], at: int) -> Callable[[int], float]:
    """3.5 % lower over some 60 steps from step ``at``."""
    return lambda k: curve(k) * (1.0 - 0.035 * (1.0 - math.exp(-max(0, k - at) / 60.0)))


def spike(curve: Callable[[int], float], at: int) -> Callable[[int], float]:
    """3x at step ``at``, decaying over 40 steps."""
    return lambda k: curve(k) * (1.0 + (2.0 * math.exp(-(k - at) / 40.0) if k >= at else 0.0))


def exponential(tau: float, step: float) -> Callable[[int], float]:
    return lambda k: 2.1 + 8.7 * math.exp(-k * step / tau)


def test_a_plateau_in_a_young_job_is_found() -> None:
    """The loss falls from the job's start and stops dead at 60, 200 or 400 s (0.6 and 2 s steps):
    found within the plateau; before, nothing until the short test, which needs a falling window
    before the flat one, and a plateau at 60 s has none."""
    for step, onset, latest in (
        (0.6, 60, 400),
        (2.0, 60, 400),
        (0.6, 200, 480),
        (2.0, 200, 480),
        (0.6, 400, 700),
    ):
        for seed in range(2):
            stop = int(onset / step)
            onsets = young_onsets(flat_from(stop), 1200, step, seed=seed)
            assert onsets and onset + 180 <= onsets[0] <= latest, (step, onset, seed, onsets)


def test_a_young_plateau_across_a_restart_from_a_checkpoint_is_found() -> None:
    """Flat from 400 s; the job fails at 450 s and restarts a minute later from 100 s of steps back:
    its loss resumes flat (the plateau holds), and the curve before the checkpoint still stands."""
    stop = int(400 / 0.7)
    onsets = young_onsets(flat_from(stop), 1200, 0.7, restart_at=450, back=int(100 / 0.7))
    assert onsets and 450 < onsets[0] <= 900, onsets


def test_young_curves_that_decelerate_naturally_raise_no_plateau() -> None:
    """The first half hour of power laws (exponents 0.3-1, knees at 10-100 steps), exponentials
    decaying over 60 s with a slow tail, a learning-rate warm-up over 500 and 2000 steps, 0.3-5 s
    steps, 8 ranks at 1.2 % or one rank at 6 % per step."""
    shapes: list[tuple[str, Callable[[float], Callable[[int], float]]]] = [
        ("power a=0.3 k0=10", lambda s: lambda k: 2.1 + 8.7 * math.pow(1.0 + k / 10.0, -0.3)),
        ("power a=1.0 k0=100", lambda s: lambda k: 2.1 + 8.7 * math.pow(1.0 + k / 100.0, -1.0)),
        ("power a=0.55 k0=30", lambda s: power),
        (
            "exp 60 s + tail",
            lambda s: lambda k: 1.1 + 8.7 * math.exp(-k * s / 60.0) + math.pow(1 + k / 30, -0.3),
        ),
        ("warm-up 500", lambda s: lambda k: power(k * k / 1000.0 if k < 500 else k - 250.0)),
        ("warm-up 2000", lambda s: lambda k: power(k * k / 4000.0 if k < 2000 else k - 1000.0)),
    ]
    for name, make in shapes:
        for step in (0.3, 1.0, 5.0):
            for seed, (ranks, noise) in enumerate(((8, 0.012), (1, 0.06))):
                got = young_onsets(make(step), 1800, step, seed=seed, ranks=ranks, noise=noise)
                assert got == [], (name, step, ranks, got)


def test_a_pure_exponential_is_a_plateau_only_once_it_has_converged() -> None:
    """A loss decaying as exp(-t/tau) to a hard floor is flat in fact once it is there; no test calls
    it a plateau before it is within 0.1 % of its floor (8.3 tau for a fall of 8.7 onto 2.1)."""
    for tau in (60.0, 120.0, 300.0, 900.0):
        for step in (0.3, 1.0, 5.0):
            for seed, (ranks, noise) in enumerate(((8, 0.012), (1, 0.06))):
                got = young_onsets(exponential(tau, step), 1800, step, seed=seed, ranks=ranks, noise=noise)
                assert all(t >= tau * math.log(8.7 / 0.0021) for t in got), (tau, step, ranks, got)


def test_resumed_and_disturbed_young_jobs_raise_no_plateau() -> None:
    """A job resumed late in its curve (steps from 20,000: low and flat from the start), with a
    start transient (15 % decaying over 10 steps) and numbered from 0 or not, one whose learning
    rate drops 5 minutes in; a young job with an early learning-rate drop, a 3x spike at 300 s, or a
    restart from a checkpoint."""
    for step in (0.5, 2.0):
        at = int(300 / step)
        cases: list[tuple[str, Callable[[int], float], dict[str, Any]]] = [
            ("resumed", late, {"first": 20_000}),
            ("resumed, transient", transient(late), {"first": 20_000}),
            ("resumed from 0, transient", transient(late), {}),
            ("resumed, lr drop", lr_drop(late, at), {"first": 20_000}),
            ("young, lr drop", lr_drop(power, at), {}),
            ("young, spike", spike(power, at), {}),
            ("young, restart", power, {"restart_at": 400, "back": int(100 / step)}),
        ]
        for name, shape, kw in cases:
            for seed, (ranks, noise) in enumerate(((8, 0.012), (1, 0.06))):
                got = young_onsets(shape, 1500, step, seed=seed, ranks=ranks, noise=noise, **kw)
                assert got == [], (name, step, ranks, got)
