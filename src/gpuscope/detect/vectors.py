"""Vectorised, NaN-safe baselines: one array slot per entity, updated in a few numpy operations.

The scalar baselines of :mod:`gpuscope.detect.baseline` cost a Python call per entity; a hub
watching thousands of GPUs at 1 Hz needs one call per *evaluation* instead. Everything here keeps
arrays indexed by a dense entity id (:mod:`gpuscope.detect.gputable`) and grows on demand.
A NaN input leaves its slot untouched, so a missing sample never poisons a baseline; ``mask``
arguments freeze slots (a baseline must not learn the anomaly it is judging).

Also here: a change-point test (one-sided CUSUM with a warm-up), a seasonal (time-of-day)
baseline for diurnal load, and peer statistics (median of a group, leave-one-out).
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.frames import BoolArray
from gpuscope.model import FloatArray

IntArray = np.ndarray[tuple[int], np.dtype[np.intp]]


def alpha_for(dt: float, tau: float) -> float:
    """Weight of a new sample in a continuous-time EWMA with time constant ``tau`` seconds."""
    if tau <= 0:
        raise ValueError(f"time constant must be positive, got {tau}")
    return 1.0 - math.exp(-max(dt, 0.0) / tau)


def grow(array: FloatArray, size: int, fill: float = math.nan) -> FloatArray:
    """``array`` extended to at least ``size`` slots (doubling), new slots set to ``fill``."""
    if len(array) >= size:
        return array
    out = np.full(max(size, 2 * len(array), 16), fill)
    out[: len(array)] = array
    return out


def grow_codes(codes: IntArray, size: int) -> IntArray:
    """:func:`grow` for integer codes (a job's, a node's, a speed group's), new slots -1 (none)."""
    if len(codes) >= size:
        return codes
    out = np.full(max(size, 2 * len(codes), 16), -1, np.intp)
    out[: len(codes)] = codes
    return out


def group_max(values: FloatArray, groups: IntArray, mask: BoolArray, size: int) -> FloatArray:
    """Per group (0..size-1), the largest of the ``mask``-ed values of its elements; -inf for a
    group with none. ``groups``: small non-negative integer codes (a node's, a job's)."""
    top = np.full(size, -math.inf)
    np.maximum.at(top, groups[mask], values[mask])
    return top


class VecEwma:
    """Exponentially weighted mean and variance per slot; the first finite value seeds a slot."""

    __slots__ = ("count", "mean", "var")

    def __init__(self, size: int = 0) -> None:
        self.mean: FloatArray = np.full(size, math.nan)
        self.var: FloatArray = np.zeros(size)
        self.count: FloatArray = np.zeros(size)

    def ensure(self, size: int) -> None:
        if len(self.mean) < size:
            self.mean = grow(self.mean, size)
            self.var = grow(self.var, size, 0.0)
            self.count = grow(self.count, size, 0.0)

    def update(self, values: FloatArray, alpha: float | FloatArray, mask: BoolArray | None = None) -> None:
        """Fold ``values`` (one per slot, NaN = none) in with weight ``alpha``; ``mask`` False freezes."""
        n = len(values)
        self.ensure(n)
        mean, var, count = self.mean[:n], self.var[:n], self.count[:n]
        ok = np.isfinite(values)
        if mask is not None:
            ok &= mask
        fresh = ok & (count == 0)
        mean[fresh] = values[fresh]
        upd = ok & ~fresh
        a = alpha if isinstance(alpha, float) else alpha[upd]
        delta = values[upd] - mean[upd]
        mean[upd] += a * delta
        var[upd] = (1.0 - a) * (var[upd] + a * delta * delta)
        count[ok] += 1

    @property
    def std(self) -> FloatArray:
        return np.sqrt(self.var)

    def reset(self, slots: BoolArray | IntArray) -> None:
        self.mean[slots] = math.nan
        self.var[slots] = 0.0
        self.count[slots] = 0.0


class Cusum:
    """One-sided CUSUM change-point test on a standardised stream, with a warm-up.

    The first ``warmup`` values estimate mean and spread (robustly: median and MAD); after that
    ``s = max(0, s + z - drift)`` accumulates evidence of an upward shift and :attr:`alarm` holds
    while ``s >= threshold``. Non-finite values are skipped.

    Two options make it a test for a *material* shift from a *moving* level: ``min_shift`` (a
    share of the level) raises the allowance to half of it (the optimal allowance for a shift of
    that size) where that exceeds ``drift`` spreads, so a smaller shift adds nothing however long it
    lasts; and :meth:`push` may take the level to measure from (a rolling baseline) instead of the
    warm-up's mean. ``s`` is capped at ``cap`` times the threshold, so once the level has caught up
    with a shift the alarm ends within a few values, however long the shift had lasted.
    """

    __slots__ = ("_seed", "cap", "drift", "mean", "min_shift", "s", "spread", "threshold", "warmup")

    def __init__(
        self,
        drift: float = 0.5,
        threshold: float = 8.0,
        warmup: int = 30,
        min_shift: float = 0.0,
        cap: float = math.inf,
    ) -> None:
        if warmup < 3:
            raise ValueError(f"warm-up needs at least 3 values, got {warmup}")
        if min_shift < 0 or not cap >= 1.0:
            raise ValueError(f"min_shift must be at least 0 and cap at least 1, got {min_shift}, {cap}")
        self.drift, self.threshold, self.warmup = drift, threshold, warmup
        self.min_shift, self.cap = min_shift, cap
        self._seed: list[float] = []
        self.mean = math.nan
        self.spread = math.nan
        self.s = 0.0

    @property
    def warm(self) -> bool:
        return math.isfinite(self.mean)

    def allowance(self, level: float) -> float:
        """How far above ``level`` a value must be to add evidence, in spreads."""
        return max(self.drift, 0.5 * self.min_shift * abs(level) / self.spread)

    def push(self, value: float, level: float = math.nan) -> bool:
        """Add a value, measured from ``level`` (the warm-up's mean if not finite); True while the
        test is in alarm."""
        if not math.isfinite(value):
            return self.alarm
        if not self.warm:
            self._seed.append(value)
            if len(self._seed) >= self.warmup:
                seed = np.asarray(self._seed)
                self.mean = float(np.median(seed))
                mad = float(np.median(np.abs(seed - self.mean)))  # robust: a hiccup in warm-up is ignored
                self.spread = max(1.4826 * mad, 1e-6 * max(abs(self.mean), 1.0))
                self._seed = []
            return False
        level = level if math.isfinite(level) else self.mean
        z = (value - level) / self.spread
        self.s = min(max(0.0, float(self.s + z - self.allowance(level))), self.cap * self.threshold)
        return self.alarm

    @property
    def alarm(self) -> bool:
        return self.s >= self.threshold


class SeasonalBaseline:
    """A time-of-day baseline: one EWMA per bucket of the day, so diurnal load is expected load.

    Before a bucket has ``min_count`` values its neighbours' (then the overall) mean stands in.
    """

    __slots__ = ("_all", "_count", "_mean", "alpha", "buckets", "min_count", "period")

    def __init__(
        self, buckets: int = 96, period: float = 86400.0, alpha: float = 0.05, min_count: int = 30
    ) -> None:
        self.buckets, self.period, self.alpha, self.min_count = buckets, period, alpha, min_count
        self._mean = np.full(buckets, math.nan)
        self._count = np.zeros(buckets)
        self._all = VecEwma(1)

    def _bucket(self, ts: float) -> int:
        return int((ts % self.period) / self.period * self.buckets) % self.buckets

    def push(self, ts: float, value: float) -> None:
        if not (math.isfinite(value) and math.isfinite(ts)):
            return
        b = self._bucket(ts)
        if self._count[b] == 0:
            self._mean[b] = value
        else:
            self._mean[b] += self.alpha * (value - self._mean[b])
        self._count[b] += 1
        self._all.update(np.array([value]), 0.01)

    def known(self, ts: float) -> bool:
        """Whether the bucket of ``ts`` itself has ``min_count`` values (not a neighbour's stand-in)."""
        return bool(self._count[self._bucket(ts)] >= self.min_count)

    def expected(self, ts: float) -> float:
        """The baseline at ``ts``; NaN before anything was seen."""
        b = self._bucket(ts)
        if self._count[b] >= self.min_count:
            return float(self._mean[b])
        near = [(b + d) % self.buckets for d in (-1, 1)]
        known = [self._mean[k] for k in near if self._count[k] >= self.min_count]
        return float(np.mean(known)) if known else float(self._all.mean[0])


def quantile(values: FloatArray, q: float) -> float:
    """The ``q`` quantile of the finite values; NaN when there are none."""
    finite = values[np.isfinite(values)]
    return float(np.quantile(finite, q)) if finite.size else math.nan


def group_median(values: FloatArray, groups: IntArray) -> FloatArray:
    """Per element, the median of the finite values of its group (NaN when its group has none).

    ``groups`` are small non-negative integers (a job's code); sorting once keeps this vectorised.
    """
    out = np.full(len(values), math.nan)
    ok = np.isfinite(values) & (groups >= 0)
    if not ok.any():
        return out
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((values[idx], groups[idx]))]
    g = groups[order]
    bounds = np.flatnonzero(np.diff(g)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(order)]))
    sorted_vals = values[order]
    lo = (starts + ends - 1) // 2
    hi = (starts + ends) // 2
    medians = 0.5 * (sorted_vals[lo] + sorted_vals[hi])
    per_group = np.full(int(groups.max()) + 1, math.nan)
    per_group[g[starts]] = medians
    valid = groups >= 0
    out[valid] = per_group[groups[valid]]
    return out


def group_count(mask: BoolArray, groups: IntArray, size: int) -> FloatArray:
    """How many elements of each group (0..size-1) have ``mask`` set."""
    valid = mask & (groups >= 0)
    return np.bincount(groups[valid], minlength=size).astype(float)


def speed_groups(paces: dict[int, float], gap: float, min_size: int = 2) -> dict[int, int]:
    """Cluster ranks (or GPUs) by their healthy pace, a lag where smaller is faster (1-D): split
    the sorted paces at every gap of at least ``gap`` that leaves ``min_size`` or more on each
    side; group 0 is the fastest."""
    order = sorted(paces, key=lambda r: paces[r])
    cuts = [
        i for i in range(min_size, len(order) - min_size + 1) if paces[order[i]] - paces[order[i - 1]] >= gap
    ]
    kept: list[int] = []
    for i in cuts:  # every group keeps min_size ranks, also between two cuts
        if not kept or i - kept[-1] >= min_size:
            kept.append(i)
    group: dict[int, int] = {}
    g = 0
    for i, rank in enumerate(order):
        if g < len(kept) and i >= kept[g]:
            g += 1
        group[rank] = g
    return group
