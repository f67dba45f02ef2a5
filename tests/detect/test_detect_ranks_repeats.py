"""Repeated readings are not evidence. A worker's logger that writes its step time every 10 s, read
every second, repeats each reading ten times: one slow reading read ten times is one reading, not a
straggler that lasted ten steps. Slow readings that are new each time still are, and so is a slowdown
whose repeated readings keep coming for longer than half a minute."""

from __future__ import annotations

import numpy as np

from detect.rank_traces import flags, trace

LEVELS = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.99, 1.0, 1.01, 0.98, 1.0, 1.02, 0.99]
WORKER, SLOW = 5, 100  # the worker that slows down, and the second it starts
EVERY = 1.0  # one reading a second


def read_every_second(times: np.ndarray, written_every: int) -> np.ndarray:
    """What a scraper reading every second sees of a logger that writes every ``written_every``
    readings: each written reading repeated until the next one."""
    out = times.copy()
    for k in range(len(out)):
        out[k] = times[k - k % written_every]
    return out


def test_one_slow_reading_read_ten_times_is_no_straggler() -> None:
    for seed in range(4):
        times = trace(LEVELS, 200, seed, noise=0.01, repeat=0.0)
        times[SLOW : SLOW + 10, WORKER] = 1.3 * LEVELS[WORKER]  # one reading at 1.3x, ten copies
        seen = flags(times, EVERY)
        assert not any(WORKER in s for s in seen), seed


def test_ten_new_slow_readings_in_ten_seconds_are_a_straggler() -> None:
    for seed in range(4):
        times = trace(LEVELS, 200, seed, noise=0.01, repeat=0.0)
        times[SLOW : SLOW + 10, WORKER] *= 1.3  # ten readings at 1.3x, each its own
        seen = flags(times, EVERY)
        assert any(WORKER in s for s in seen[SLOW : SLOW + 20]), seed
        assert not any(WORKER in s for s in seen[:SLOW]), seed


def test_a_slowdown_logged_every_ten_seconds_is_found_within_a_minute() -> None:
    for seed in range(4):
        times = trace(LEVELS, 300, seed, noise=0.01, repeat=0.0)
        times[SLOW : SLOW + 120, WORKER] *= 1.3  # two minutes at 1.3x
        seen = flags(read_every_second(times, 10), EVERY)
        assert any(WORKER in s for s in seen[SLOW : SLOW + 60]), seed
        assert not any(WORKER in s for s in seen[:SLOW]), seed
