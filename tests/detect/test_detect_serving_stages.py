"""inference_latency_regression follows a changing fault: a latency that grows materially worse
while its alert is open (the rule's stage bar, measured on the series' own noise before the alert,
held its hold) is a stage of worsening, told again; the noise of a steady regression is not."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT
from gpuscope.model import Finding
from support import chat_snapshot, judge_chat


def run(
    minutes: int, factor: dict[tuple[int, int], float], jitter: float = 0.0, seed: int = 5
) -> list[tuple[float, list[Finding]]]:
    """The ``chat`` service reporting every second for ``minutes``, its latency carrying a slow
    wander (3 %, two-minute memory) and each sample ``jitter`` more log-normal noise; ``factor``
    multiplies p95 latency from one minute to another."""
    rng = np.random.default_rng(seed)
    wander = 0.0

    def snapshot(ts: float) -> Snapshot:
        nonlocal wander
        wander += -wander / 120.0 + 0.03 * math.sqrt(2.0 / 120.0) * float(rng.standard_normal())
        snap = chat_snapshot(ts, rng, latency=math.exp(wander))
        for (first, last), f in factor.items():
            if first * 60 <= ts < last * 60:
                snap.p95 *= f * float(np.exp(jitter * rng.standard_normal()))
        return snap

    return judge_chat((float(t) for t in range(minutes * 60)), snapshot)


def stages(results: list[tuple[float, list[Finding]]]) -> list[tuple[float, int]]:
    """(time, stage) each time the latency finding's stage changed."""
    out: list[tuple[float, int]] = []
    for ts, found in results:
        for f in found:
            if f.rule == LATENCY and (not out or out[-1][1] != f.stage):
                out.append((ts, f.stage))
    return out


def test_a_latency_that_doubles_again_while_its_alert_is_open_is_told_again_once() -> None:
    # 2x from minute 30; from minute 34 it doubles again, until minute 40
    results = run(45, {(30, 34): 2.0, (34, 40): 4.0})
    told = stages(results)
    assert [s for _, s in told] == [0, 1], told
    assert 34 * 60 + 30 <= told[1][0] <= 36 * 60, told  # the worse level held for the bar's hold
    found = next(f for ts, fs in results if ts == told[1][0] for f in fs if f.rule == LATENCY)
    assert "grew materially worse 1 time(s)" in found.summary
    assert not any(f.rule == TTFT for _, fs in results for f in fs)


def test_noise_around_a_steady_regression_never_escalates() -> None:
    # 2x for twenty minutes, each sample ±15 % more (log-normal): one alert, never a stage
    for seed in (5, 6, 7):
        told = stages(run(55, {(30, 50): 2.0}, jitter=0.15, seed=seed))
        assert [s for _, s in told] == [0], (seed, told)


def test_a_latency_that_creeps_up_by_less_than_the_bar_is_no_stage() -> None:
    # 2x, then 2.4x: worse by a fifth, under a shift as large as the one the rule fires on
    assert [s for _, s in stages(run(45, {(30, 34): 2.0, (34, 40): 2.4}))] == [0]
