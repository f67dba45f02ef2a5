"""Small lasting lags on noisy workers: evidence that grows with time. A worker with 10 % noise per
reading (one every 10 s) has a long-window bar of three spreads, about 30 %, so a 1.2x slowdown of
ten minutes sat under it; a sequential test on its readings over its level finds it within a few
minutes, while healthy noisy workers stay quiet."""

from __future__ import annotations

from detect.rank_traces import flags, trace

LEVELS = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.99]
SLOW, END = 120, 180  # ten minutes of worker 5


def found_within(factor: float, noise: float, seeds: range, within: int) -> int:
    hits = 0
    for seed in seeds:
        times = trace(LEVELS, 300, seed, noise, repeat=0.0)
        times[SLOW:END, 5] *= factor
        seen = flags(times)
        hits += any(5 in s for s in seen[SLOW : SLOW + within])
        assert not any(5 in s for s in seen[: SLOW - 1]), seed
    return hits


def test_a_twenty_percent_lag_on_a_worker_with_ten_percent_noise_is_found_within_three_minutes() -> None:
    assert found_within(1.2, 0.10, range(8), 18) == 8  # 2 of 8 before


def test_a_fifteen_percent_lag_on_a_worker_with_five_percent_noise_is_found_within_three_minutes() -> None:
    assert found_within(1.15, 0.05, range(8), 18) >= 5  # 3 of 8 before


def test_healthy_workers_with_ten_percent_noise_stay_quiet() -> None:
    for seed in range(100, 108):
        assert set().union(*flags(trace(LEVELS, 300, seed, 0.10, repeat=0.0))) == set(), seed
