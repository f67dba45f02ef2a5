"""Rolling baselines for streaming detectors: small, NaN-safe, cheap to create and to feed.

Detectors keep one of these per entity (GPU, node, job, rank), so each holds a bounded window
and costs O(window) per update at most (a short window, kept sorted, so a median is an index).
Non-finite inputs are ignored rather than poisoning the baseline: a missing sample is not a zero.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

NAN = math.nan


def _check_size(size: int) -> None:
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")


def median(values: list[float]) -> float:
    """Median of the finite values; NaN when there are none."""
    finite = sorted(v for v in values if math.isfinite(v))
    n = len(finite)
    if n == 0:
        return NAN
    mid = n // 2
    return finite[mid] if n % 2 else 0.5 * (finite[mid - 1] + finite[mid])


class RollingMedian:
    """Median, MAD and maximum of the last ``size`` finite values.

    The window is also kept sorted, one insertion and one removal per value, so the median is an
    index: senders push every tick and the detectors read every tick, and sorting the window
    again at each read cost more than all of a tick's other liveness work."""

    __slots__ = ("_buf", "_sorted")

    def __init__(self, size: int = 31) -> None:
        _check_size(size)
        self._buf: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    def push(self, value: float) -> bool:
        """Add a value; returns False (and keeps the window unchanged) for NaN or infinity."""
        if not math.isfinite(value):
            return False
        buf, ordered = self._buf, self._sorted
        if len(buf) == buf.maxlen:
            # equal values sit in the order they came (insort puts a value after its equals), so
            # the first one equal to the oldest is the oldest itself (0.0 and -0.0 are equal)
            del ordered[bisect_left(ordered, buf[0])]
        buf.append(value)
        insort(ordered, value)
        return True

    def __len__(self) -> int:
        return len(self._buf)

    def median(self) -> float:
        ordered = self._sorted
        n = len(ordered)
        if n == 0:
            return NAN
        mid = n // 2
        return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])

    def mad(self) -> float:
        """Median absolute deviation from the median: a spread estimate that ignores outliers."""
        m = self.median()
        return median([abs(v - m) for v in self._buf]) if self._buf else NAN

    def max(self) -> float:
        return max(self._buf) if self._buf else NAN

    def robust_z(self, value: float, min_spread: float = 1e-9) -> float:
        """How many (MAD-scaled) deviations ``value`` lies above the median; NaN without a baseline."""
        if not self._buf or not math.isfinite(value):
            return NAN
        spread = max(1.4826 * self.mad(), min_spread)
        return (value - self.median()) / spread


class Ewma:
    """Exponentially weighted mean and variance; ``alpha`` is the weight of each new sample."""

    __slots__ = ("alpha", "count", "mean", "var")

    def __init__(self, alpha: float = 0.1) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.mean = NAN
        self.var = 0.0
        self.count = 0

    @classmethod
    def from_halflife(cls, samples: float) -> Ewma:
        """An EWMA whose weights halve every ``samples`` updates."""
        if samples <= 0:
            raise ValueError(f"half-life must be positive, got {samples}")
        return cls(1.0 - 0.5 ** (1.0 / samples))

    def push(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        self.count += 1
        if self.count == 1:
            self.mean = value
            return True
        delta = value - self.mean
        self.mean += self.alpha * delta
        # West's incremental form: the variance of the same exponential weighting
        self.var = (1.0 - self.alpha) * (self.var + self.alpha * delta * delta)
        return True

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def zscore(self, value: float, min_std: float = 1e-9) -> float:
        if self.count == 0 or not math.isfinite(value):
            return NAN
        return (value - self.mean) / max(self.std, min_std)


class IntervalEstimator:
    """A sender's reporting period: the rolling median of the gaps between its distinct timestamps.

    The median shrugs off jitter and one-off outages, so an outage does not teach the detector
    that long silences are normal.
    """

    __slots__ = ("_gaps", "last", "reports")

    def __init__(self, size: int = 15) -> None:
        self._gaps = RollingMedian(size)
        self.last: float | None = None
        self.reports = 0

    def push(self, ts: float) -> bool:
        """Note a report at ``ts``; a repeated or older timestamp is not a new report."""
        if not math.isfinite(ts) or (self.last is not None and ts <= self.last):
            return False
        if self.last is not None:
            self._gaps.push(ts - self.last)
        self.last = ts
        self.reports += 1
        return True

    @property
    def interval(self) -> float | None:
        return self._gaps.median() if len(self._gaps) else None


class FlagWindow:
    """Seconds a condition held within a sliding time window, time-weighted.

    Each sample stands for the time since the previous one, capped at ``max_step`` so a gap in
    reporting is not counted as time spent in either state. ``held`` is therefore comparable to
    the window length whatever the sampling rate.
    """

    __slots__ = ("_samples", "held", "last", "max_step", "observed", "window")

    def __init__(self, window: float = 60.0, max_step: float = 5.0) -> None:
        if window <= 0 or max_step <= 0:
            raise ValueError(f"window and max_step must be positive, got {window} and {max_step}")
        self.window = window
        self.max_step = max_step
        self._samples: deque[tuple[float, float, bool]] = deque()
        self.held = 0.0
        self.observed = 0.0
        self.last: float | None = None

    def push(self, ts: float, flag: bool, step: float | None = None) -> None:
        """Add a sample; ``step`` is the time it stands for when there is no previous sample."""
        if not math.isfinite(ts) or (self.last is not None and ts <= self.last):
            return
        dt = step if self.last is None else ts - self.last
        dt = min(max(dt or 0.0, 0.0), self.max_step)
        self.last = ts
        self._samples.append((ts, dt, flag))
        self.observed += dt
        if flag:
            self.held += dt
        self._evict(ts - self.window)

    def _evict(self, horizon: float) -> None:
        samples = self._samples
        while samples and samples[0][0] <= horizon:
            _, dt, flag = samples.popleft()
            self.observed -= dt
            if flag:
                self.held -= dt
        if not samples:
            self.held = self.observed = 0.0

    def fraction(self) -> float:
        """Share of the window the condition held (0 with no data)."""
        return self.held / self.window

    def any_flag(self) -> bool:
        return self.held > 1e-9


def finite_or_none(value: float | None) -> float | None:
    """A value fit for an alert's details (JSON has no NaN): None when missing or not finite."""
    return value if value is not None and math.isfinite(value) else None
