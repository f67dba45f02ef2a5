"""A sustained latency or TTFT shift below the fast tier's bar (1.3x, or the series' noise): the
slower tier judges the median over two minutes against its own, smaller noise, so a 1.2x shift
held for five minutes fires within them, while a short one and a noisy series' wander stay quiet."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT
from support import chat_snapshot, judge_chat, onsets_of

START, HOURS = 1800.0, 2.0


def run(rule: str, factor: float, seconds: float, sigma: float = 0.04, seed: int = 7) -> list[float]:
    """Onsets of ``rule`` for the chat service scraped every second, its latency (or TTFT) a
    log-normal sample (``sigma``) times ``factor`` from ``START`` for ``seconds``."""
    rng = np.random.default_rng(seed)

    def snapshot(ts: float) -> Snapshot:
        f = factor if START <= ts < START + seconds else 1.0
        snap = chat_snapshot(ts, rng, latency=f if rule == LATENCY else 1.0, ttft=f if rule == TTFT else 1.0)
        if rule == LATENCY:
            snap.p95 = 0.4 * f * float(np.exp(sigma * rng.standard_normal()))
        else:
            snap.ttft = 0.1 * f * float(np.exp(sigma * rng.standard_normal()))
        return snap

    return onsets_of(judge_chat((float(t) for t in range(int(HOURS * 3600))), snapshot), rule)


def test_a_sustained_small_latency_shift_fires_once_within_it() -> None:
    onsets = run(LATENCY, 1.2, 300.0)
    assert len(onsets) == 1, onsets
    assert START + 90.0 <= onsets[0] < START + 300.0, onsets


def test_a_sustained_small_ttft_shift_fires_once_within_it() -> None:
    onsets = run(TTFT, 1.25, 300.0)
    assert len(onsets) == 1, onsets
    assert START + 90.0 <= onsets[0] < START + 300.0, onsets


def test_a_short_small_shift_and_a_noisy_series_stay_quiet() -> None:
    assert run(LATENCY, 1.2, 60.0) == []
    assert run(LATENCY, 1.0, 0.0, sigma=0.3) == []
    assert run(LATENCY, 1.0, 0.0, sigma=0.3, seed=8) == []


def test_the_slow_tier_does_not_fire_what_the_noise_of_its_long_median_explains() -> None:
    # a series whose two-minute median itself wanders by 20 %: a 1.2x shift is its normal range
    rng = np.random.default_rng(5)
    walk = np.exp(0.2 * np.sin(np.arange(int(HOURS * 3600)) * 2 * math.pi / 600.0))

    def snapshot(ts: float) -> Snapshot:
        snap = chat_snapshot(ts, rng)
        snap.p95 = 0.4 * float(walk[int(ts)]) * float(np.exp(0.04 * rng.standard_normal()))
        return snap

    assert onsets_of(judge_chat((float(t) for t in range(int(HOURS * 3600))), snapshot), LATENCY) == []
