"""A young service: its latency baseline is learned from its first minutes, so a regression a few
minutes after it started reporting fires within its duration, its first minutes stay quiet, and a
fault in them is not learned as its normal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT
from support import chat_snapshot, judge_chat, onsets

START = 1000.0  # the service's first report


def run(
    spikes: Sequence[tuple[float, float, float]], seconds: float = 400.0, seed: int = 7
) -> list[tuple[float, str]]:
    """(seconds after the first report, rule) of each onset of a service reporting every second;
    each of ``spikes`` (from, to, factor, in seconds after its first report) multiplies latency and
    TTFT."""
    rng = np.random.default_rng(seed)

    def snapshot(ts: float) -> Snapshot:
        age = ts - START
        factor = next((f for start, end, f in spikes if start <= age < end), 1.0)
        return chat_snapshot(ts, rng, latency=factor, ttft=factor, requests=50.0)

    found = onsets(judge_chat((START + k for k in range(int(seconds))), snapshot))
    return [(ts - START, rule) for ts, rule in found]


def test_a_latency_spike_minutes_after_the_service_started_fires_while_it_lasts() -> None:
    # the demo's shape: 3x, 260 s after the first report, for 60 s (it fired at 321 s, after the end)
    for factor in (3.0, 2.0):
        got = run([(260.0, 320.0, factor)])
        assert sorted(rule for _, rule in got) == [LATENCY, TTFT], (factor, got)
        assert all(260.0 < t < 300.0 for t, _ in got), (factor, got)


def test_the_first_minutes_of_a_healthy_service_raise_nothing() -> None:
    for seed in range(5):
        assert run([], seconds=900.0, seed=seed) == []


def test_a_fault_in_the_warm_up_is_not_learned_as_the_services_normal() -> None:
    # 3x for 30 s of the first minute (only learned), then healthy for 230 s: the plain mean of
    # those minutes took 1.2x for the operating point and the fault's height for the series' noise
    # (a limit 3.3x the healthy level), so a second spike, 3x for 90 s, was missed; not 1.6x either
    for seed in range(3):
        for factor in (3.0, 2.0, 1.6):
            got = run([(10.0, 40.0, 3.0), (270.0, 360.0, factor)], seconds=500.0, seed=seed)
            assert sorted(rule for _, rule in got) == [LATENCY, TTFT], (seed, factor, got)
            assert all(270.0 < t < 360.0 for t, _ in got), (seed, factor, got)
