"""A service whose latency is updated once a minute and scraped every 10 s: the detector judges the
median of its fresh values against the series' own noise, for at least two fresh values, so one odd
sample (repeated by every scrape until the next update) and a noisy series' normal wander stay
quiet, while a doubling that lasts ten minutes fires within it."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY
from support import chat_snapshot, judge_chat, onsets_of

UPDATE, SCRAPE = 60.0, 10.0


def run(
    hours: float,
    sigma: float,
    factor: dict[int, float] | None = None,
    seed: int = 3,
) -> list[float]:
    """Latency onsets; the latency is a log-normal sample (``sigma``) drawn once a minute and held
    between updates; ``factor`` multiplies the sample of the given minutes."""
    rng = np.random.default_rng(seed)
    minutes = int(hours * 60)
    samples = [float(np.exp(sigma * rng.standard_normal())) for _ in range(minutes + 1)]
    for minute, f in (factor or {}).items():
        samples[minute] *= f

    def snapshot(ts: float) -> Snapshot:
        snap = chat_snapshot(ts, rng, requests=5.0)
        snap.p95 = 10.0 * samples[int(ts // UPDATE)]
        snap.ttft = math.nan
        return snap

    return onsets_of(judge_chat((SCRAPE * k for k in range(int(hours * 3600 / SCRAPE))), snapshot), LATENCY)


def test_one_odd_sample_held_by_the_scrapes_raises_nothing() -> None:
    # a 3x sample every 20 minutes, each held for a minute (six scrapes)
    assert run(3.0, 0.05, {m: 3.0 for m in range(30, 180, 20)}) == []


def test_a_noisy_series_wanders_without_alerts_and_a_ten_minute_doubling_fires_within_it() -> None:
    assert run(6.0, 0.3) == []
    start = 240  # minute 240, in the fifth hour
    onsets = run(6.0, 0.3, {m: 2.0 for m in range(start, start + 10)})
    assert len(onsets) == 1, onsets
    assert start * UPDATE < onsets[0] < (start + 10) * UPDATE, onsets
