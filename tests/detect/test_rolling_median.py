"""The rolling median kept sorted as it goes gives what sorting the window at each read gave."""

from __future__ import annotations

import math
import random
from collections import deque

from gpuscope.detect.baseline import IntervalEstimator, RollingMedian, median


def test_the_median_of_every_window_is_that_of_the_window_sorted_afresh() -> None:
    rng = random.Random(7)
    for size in (1, 2, 5, 15, 31):
        rolling, window = RollingMedian(size), deque[float](maxlen=size)
        for _ in range(400):
            # repeats, signed zeros, and values a sender jitters around: the hard cases for a removal
            value = rng.choice([0.0, -0.0, 1.0, 1.0, rng.uniform(0.9, 1.1), rng.uniform(-5, 5), math.nan])
            assert rolling.push(value) == math.isfinite(value)
            if math.isfinite(value):
                window.append(value)
            assert len(rolling) == len(window)
            if not window:
                assert math.isnan(rolling.median()) and math.isnan(rolling.mad())
                continue
            got, want = rolling.median(), median(list(window))
            assert got == want and math.copysign(1, got) == math.copysign(1, want)
            assert rolling.mad() == median([abs(v - want) for v in window])
            assert rolling.max() == max(window)


def test_a_senders_interval_follows_its_gaps() -> None:
    clock = IntervalEstimator(size=3)
    assert clock.interval is None
    for ts in (0.0, 1.0, 2.0, 3.0, 13.0, 23.0):
        clock.push(ts)
    assert clock.interval == 10.0  # the last three gaps: 1, 10, 10
    assert not clock.push(23.0)  # not a new report
    assert clock.interval == 10.0
