"""Small sustained latency and TTFT regressions (1.2x) on a service that reports every second: the
fast tier's 1.3x bar misses them; the slower step tier (the median of the last minute against the
operating point as it was before that minute, held two minutes, beyond the largest sustained shift
the series made while healthy) finds them within their ten minutes, while the same service's
healthy hours, with its demand's slow wander, raise nothing, and a doubling that the fast tier
found is not found again from the longer median's memory."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT
from support import chat_snapshot, judge_chat, onsets_of


def run(minutes: int, faults: dict[str, tuple[int, int, float]], seed: int = 5) -> dict[str, list[float]]:
    """Onsets per rule of the ``chat`` service reporting every second for ``minutes``; its latency
    and TTFT carry a slow wander (3 %, two-minute memory: its demand's bursts) beside each sample's
    own noise; ``faults`` multiply a series (``p95`` or ``ttft``) from one minute to another."""
    rng = np.random.default_rng(seed)
    wander = 0.0

    def factor(name: str, ts: float) -> float:
        first, last, f = faults.get(name, (0, 0, 1.0))
        return f if first * 60 <= ts < last * 60 else 1.0

    def snapshot(ts: float) -> Snapshot:
        nonlocal wander
        wander += -wander / 120.0 + 0.03 * math.sqrt(2.0 / 120.0) * float(rng.standard_normal())
        snap = chat_snapshot(ts, rng, latency=math.exp(wander), ttft=math.exp(1.5 * wander))
        snap.p95 *= factor("p95", ts)
        snap.ttft *= factor("ttft", ts)
        return snap

    results = judge_chat((float(t) for t in range(minutes * 60)), snapshot)
    return {rule: onsets_of(results, rule) for rule in (LATENCY, TTFT)}


def test_a_sustained_1_2x_latency_or_ttft_regression_is_found_within_ten_minutes() -> None:
    found = run(60, {"p95": (30, 40, 1.2), "ttft": (45, 55, 1.2)})
    assert len(found[LATENCY]) == 1 and 30 * 60 < found[LATENCY][0] < 40 * 60, found
    assert len(found[TTFT]) == 1 and 45 * 60 < found[TTFT][0] < 55 * 60, found


def test_healthy_hours_with_a_wandering_demand_raise_nothing() -> None:
    assert run(150, {}, seed=11) == {LATENCY: [], TTFT: []}


def test_a_doubling_found_by_the_fast_tier_fires_once() -> None:
    found = run(60, {"p95": (30, 40, 2.0)})
    assert len(found[LATENCY]) == 1 and 30 * 60 < found[LATENCY][0] < 31 * 60, found
    assert found[TTFT] == [], found
