"""Healthy ranks whose own step times are 10 % apart per reading raise nothing: 16 ranks, one step
every 10 s, two hours. (At one step a second the same ranks raised 0-3 stragglers of 1-11 s per two
hours, seeds 1-6; that cadence is measured by eval/eval_rank_noise.py, docs/scenarios.md,
seventeenth round: 7200 steps a seed is too long for the suite.)"""

from __future__ import annotations

from detect.rank_traces import flags, trace


def test_healthy_ranks_with_ten_percent_noise_stepping_every_ten_seconds_raise_nothing() -> None:
    for seed in (1, 2, 3):
        times = trace([10.0] * 16, 720, seed, noise=0.10, repeat=0.0)
        seen = flags(times, 10.0)
        assert not set().union(*seen), (seed, [k for k, s in enumerate(seen) if s])
