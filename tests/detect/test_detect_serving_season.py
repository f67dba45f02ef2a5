"""Serving load with a daily shape: the daily peak is learned as that hour's normal, an anomaly at a
normally quiet hour still fires; errors and queue are judged against the service's own level."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.model import Finding
from support import chat_snapshot, judge_chat, onsets_of

DAY = 86400.0
PEAK_FROM, PEAK_TO = 12 * 3600.0, 14 * 3600.0  # the lunchtime rush, every day


def shape(ts: float) -> float:
    """Load-driven latency factor: a quick ramp to 1.8x at the rush (8 minutes), back after it."""
    t = ts % DAY
    if PEAK_FROM <= t < PEAK_TO:
        return 1.0 + 0.8 * min(1.0, (t - PEAK_FROM) / 480.0)
    return 1.0


def run(
    hours: float,
    anomaly: tuple[float, float, float] | None = None,
    error_ratio: float = 0.0,
    burst: tuple[float, float, float] | None = None,
    seed: int = 2,
    bursts: list[tuple[float, float, float]] | None = None,
) -> list[tuple[float, list[Finding]]]:
    """A service sampled every 10 s; ``anomaly`` (from, to, factor) on latency and TTFT, ``burst``
    (from, to, error ratio) in place of its usual ``error_ratio``, as are those of ``bursts``."""
    rng = np.random.default_rng(seed)
    spans = ([burst] if burst is not None else []) + (bursts or [])

    def snapshot(ts: float) -> Snapshot:
        factor = shape(ts)
        if anomaly is not None and anomaly[0] <= ts < anomaly[1]:
            factor *= anomaly[2]
        errors = next((e for start, end, e in spans if start <= ts < end), error_ratio)
        requests = 40.0 * (1.0 + 0.5 * math.cos(2 * math.pi * (ts - 13 * 3600.0) / DAY))
        return chat_snapshot(
            ts,
            rng,
            latency=factor,
            ttft=factor,
            p99=0.6 * factor,
            requests=requests,
            errors=requests * errors,
            queue=2.0 * factor**3,
        )

    return judge_chat((10.0 * k for k in range(int(hours * 3600 / 10))), snapshot)


def test_the_daily_peak_is_news_on_the_first_day_only_and_a_quiet_hour_anomaly_fires() -> None:
    anomaly = (DAY + 3 * 3600.0, DAY + 4 * 3600.0, 1.8)  # day two, 03:00: normally quiet
    results = run(26.0 + 14.0, anomaly=anomaly)  # through the second day's rush
    latency = onsets_of(results, "inference_latency_regression")
    second_day = [t for t in latency if t >= DAY]
    assert second_day and anomaly[0] <= second_day[0] <= anomaly[0] + 120.0
    assert not [t for t in second_day if t >= anomaly[1] + 600.0], latency  # no alert at the rush
    assert not [t for t in onsets_of(results, "inference_ttft_regression") if t >= anomaly[1] + 600.0]


def test_a_service_that_always_errs_above_the_budget_is_its_own_operating_point() -> None:
    steady = run(3.0, error_ratio=0.01)  # twice the 0.5 % budget, all the time
    assert onsets_of(steady, "inference_error_rate") == []
    burst = run(3.0, error_ratio=0.01, burst=(7200.0, 7800.0, 0.08))
    fired = onsets_of(burst, "inference_error_rate")
    assert fired and 7200.0 <= fired[0] <= 7500.0  # the 5-min window must burn too


def test_errors_with_a_daily_shape_are_judged_against_their_hour_and_a_quiet_hour_burst_fires() -> None:
    """A service that sheds some requests at every rush (3 % errors, 0.4 % otherwise): the second
    day's rush is that hour's normal; 3 % at a normally quiet hour is not."""
    rush = (PEAK_FROM, PEAK_TO, 0.03)
    night = (DAY + 3 * 3600.0, DAY + 3 * 3600.0 + 900.0, 0.03)
    results = run(26.0 + 14.0, error_ratio=0.004, bursts=[rush, (DAY + rush[0], DAY + rush[1], 0.03), night])
    fired = onsets_of(results, "inference_error_rate")
    assert [t for t in fired if night[0] <= t <= night[0] + 300.0], fired
    assert not [t for t in fired if t >= DAY + PEAK_FROM - 600.0], fired  # the second day's rush
