"""A worker's noise is measured on its readings, not on their copies. A scraper that reads a logger
three times as often as it writes sees each reading three times; the copies sit on the median they
make, so measuring the worker's spread on them made it look steadier than it is, and every bar drawn
from that spread too low: healthy workers with 10 % noise per reading were flagged as stragglers
on their own noise. A real slowdown of the same worker is still found within 45 s, as before."""

from __future__ import annotations

from detect.rank_traces import flags, trace
from detect.test_detect_ranks_repeats import LEVELS, read_every_second

EVERY, COPIES, SECONDS, SEEDS = 1.0, 3, 900, range(6)


def flagged(seen: list[set[int]]) -> int:
    """How many times a rank was newly flagged: the straggler alerts a user would get."""
    return sum(len(now - before) for before, now in zip([set(), *seen[:-1]], seen, strict=True))


def test_healthy_noisy_workers_read_three_times_per_reading_are_rarely_flagged() -> None:
    per_seed = []
    for seed in SEEDS:
        times = read_every_second(trace(LEVELS, SECONDS, seed, noise=0.1, repeat=0.0), COPIES)
        per_seed.append(flagged(flags(times, EVERY)))
    # 16 healthy workers for 15 minutes, six seeds: 19 flags in all before (up to 6 in one run),
    # 9 with the spread measured on readings; the rest come from the long window's median, which
    # copies of one reading can still hold (docs/scenarios.md, tenth round)
    assert max(per_seed) <= 3, per_seed
    assert sum(per_seed) <= 10, per_seed


def test_a_slowdown_of_a_noisy_worker_read_three_times_per_reading_is_found() -> None:
    for seed in SEEDS:
        times = trace(LEVELS, 600, seed, noise=0.1, repeat=0.0)
        times[300:420, 5] *= 1.3  # two minutes at 1.3x
        seen = flags(read_every_second(times, COPIES), EVERY)
        assert any(5 in s for s in seen[300:345]), seed  # within 45 s, as before
