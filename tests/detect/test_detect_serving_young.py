"""A young service: its latency baseline is the mean of its first minutes, so a regression a few
minutes after it started reporting fires within its duration, and its first minutes stay quiet."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import LATENCY, TTFT
from support import chat_snapshot, judge_chat, onsets

START = 1000.0  # the service's first report


def run(
    spike: tuple[float, float, float] | None, seconds: float = 400.0, seed: int = 7
) -> list[tuple[float, str]]:
    """(seconds after the first report, rule) of each onset of a service reporting every second;
    ``spike`` (from, to, factor, in seconds after its first report) multiplies latency and TTFT."""
    rng = np.random.default_rng(seed)

    def snapshot(ts: float) -> Snapshot:
        age = ts - START
        factor = spike[2] if spike is not None and spike[0] <= age < spike[1] else 1.0
        return chat_snapshot(ts, rng, latency=factor, ttft=factor, requests=50.0)

    found = onsets(judge_chat((START + k for k in range(int(seconds))), snapshot))
    return [(ts - START, rule) for ts, rule in found]


def test_a_latency_spike_minutes_after_the_service_started_fires_while_it_lasts() -> None:
    # the demo's shape: 3x, 260 s after the first report, for 60 s (it fired at 321 s, after the end)
    for factor in (3.0, 2.0):
        got = run((260.0, 320.0, factor))
        assert sorted(rule for _, rule in got) == [LATENCY, TTFT], (factor, got)
        assert all(260.0 < t < 300.0 for t, _ in got), (factor, got)


def test_the_first_minutes_of_a_healthy_service_raise_nothing() -> None:
    for seed in range(5):
        assert run(None, seconds=900.0, seed=seed) == []
