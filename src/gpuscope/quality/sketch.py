"""Bounded, mergeable summaries of a stream of values: what travels instead of raw predictions.

:class:`NumericSketch` is a DDSketch-style log-bucket histogram: every value lands in a bucket
whose bounds are within ``alpha`` relative error of it, so quantiles, the CDF (hence KS and
Wasserstein) and any binning (PSI) can be read back with bounded error, and sketches from many
processes and windows merge by adding counts. Buckets beyond ``max_buckets`` collapse the lowest
ones together (counted in ``collapsed``). :class:`CategorySketch` counts categories, the rarest
folding into ``OTHER`` beyond ``max_categories``. Both round-trip through plain JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

OTHER = "__other__"


class SketchError(ValueError):
    """A sketch that cannot be read (malformed JSON from a sender) or merged (different accuracy)."""


@dataclass(slots=True)
class NumericSketch:
    alpha: float = 0.01
    max_buckets: int = 1024
    pos: dict[int, float] = field(default_factory=dict)
    neg: dict[int, float] = field(default_factory=dict)
    zero: float = 0.0
    count: float = 0.0
    total: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    collapsed: int = 0
    invalid: int = 0  # NaN/Inf values refused
    _gamma_log: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise SketchError(f"alpha must be in (0, 0.5), got {self.alpha}")
        self._gamma_log = math.log((1.0 + self.alpha) / (1.0 - self.alpha))

    # -- writing ---------------------------------------------------------------------------------

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            self.invalid += 1
            return
        if value > 1e-12:
            k = math.ceil(math.log(value) / self._gamma_log)
            self.pos[k] = self.pos.get(k, 0.0) + 1.0
        elif value < -1e-12:
            k = math.ceil(math.log(-value) / self._gamma_log)
            self.neg[k] = self.neg.get(k, 0.0) + 1.0
        else:
            self.zero += 1.0
        self.count += 1.0
        self.total += value
        self.lo = min(self.lo, value)
        self.hi = max(self.hi, value)
        if len(self.pos) + len(self.neg) > self.max_buckets:
            self._collapse()

    def extend(self, values: Iterable[float] | npt.NDArray[np.float64]) -> None:
        for v in values:
            self.add(float(v))

    def merge(self, other: NumericSketch) -> None:
        if abs(other.alpha - self.alpha) > 1e-12:
            raise SketchError(f"cannot merge sketches of accuracy {self.alpha} and {other.alpha}")
        for mine, theirs in ((self.pos, other.pos), (self.neg, other.neg)):
            for k, c in theirs.items():
                mine[k] = mine.get(k, 0.0) + c
        self.zero += other.zero
        self.count += other.count
        self.total += other.total
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)
        self.collapsed += other.collapsed
        self.invalid += other.invalid
        while len(self.pos) + len(self.neg) > self.max_buckets:
            self._collapse()

    def _collapse(self) -> None:
        """Fold the two lowest-valued buckets together (DDSketch's collapsing store)."""
        self.collapsed += 1
        if self.neg:  # the lowest values are the most negative: largest keys of ``neg``
            keys = sorted(self.neg)[-2:]
            store = self.neg
            if len(keys) == 1:
                self.zero += store.pop(keys[0])  # pragma: no cover - only with max_buckets == 1
                return
            store[keys[0]] = store.get(keys[0], 0.0) + store.pop(keys[1])
        else:
            keys = sorted(self.pos)[:2]
            self.pos[keys[1]] = self.pos.get(keys[1], 0.0) + self.pos.pop(keys[0])

    # -- reading ---------------------------------------------------------------------------------

    def _value(self, key: int) -> float:
        """The representative value of a positive bucket (relative error ≤ alpha)."""
        g = math.exp(self._gamma_log)
        return 2.0 * g**key / (g + 1.0)

    def points(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(representative values ascending, their counts): the sketch as a weighted sample."""
        vals = [-self._value(k) for k in sorted(self.neg, reverse=True)]
        cnts = [self.neg[k] for k in sorted(self.neg, reverse=True)]
        if self.zero:
            vals.append(0.0)
            cnts.append(self.zero)
        vals += [self._value(k) for k in sorted(self.pos)]
        cnts += [self.pos[k] for k in sorted(self.pos)]
        v = np.clip(np.array(vals, dtype=np.float64), self.lo, self.hi) if vals else np.zeros(0)
        return v, np.array(cnts, dtype=np.float64)

    def quantile(self, q: float) -> float:
        if not self.count:
            return math.nan
        v, c = self.points()
        idx = int(np.searchsorted(np.cumsum(c), q * (self.count - 1) + 1, side="left"))
        return float(v[min(idx, len(v) - 1)])

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    # -- wire ------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "numeric",
            "alpha": self.alpha,
            "pos": [[k, c] for k, c in sorted(self.pos.items())],
            "neg": [[k, c] for k, c in sorted(self.neg.items())],
            "zero": self.zero,
            "count": self.count,
            "sum": self.total,
            "min": self.lo if self.count else None,
            "max": self.hi if self.count else None,
        }

    @classmethod
    def from_json(cls, data: Any, max_buckets: int = 1024) -> NumericSketch:
        try:
            s = cls(alpha=float(data["alpha"]), max_buckets=max_buckets)
            s.pos = {int(k): float(c) for k, c in data["pos"]}
            s.neg = {int(k): float(c) for k, c in data["neg"]}
            s.zero, s.count, s.total = float(data["zero"]), float(data["count"]), float(data["sum"])
            s.lo = float(data["min"]) if data["min"] is not None else math.inf
            s.hi = float(data["max"]) if data["max"] is not None else -math.inf
        except (KeyError, TypeError, ValueError) as exc:
            raise SketchError(f"not a numeric sketch: {exc!r}") from None
        counted = s.zero + sum(s.pos.values()) + sum(s.neg.values())
        if abs(counted - s.count) > 1e-6 * max(1.0, s.count) or any(c < 0 for c in s.pos.values()):
            raise SketchError("numeric sketch counts do not add up")
        while len(s.pos) + len(s.neg) > s.max_buckets:
            s._collapse()
        return s


@dataclass(slots=True)
class CategorySketch:
    max_categories: int = 256
    counts: dict[str, float] = field(default_factory=dict)
    folded: int = 0

    def add(self, value: object, weight: float = 1.0) -> None:
        key = str(value)
        if key not in self.counts and len(self.counts) >= self.max_categories:
            key = OTHER
            self.folded += 1
        self.counts[key] = self.counts.get(key, 0.0) + weight

    def extend(self, values: Iterable[object]) -> None:
        for v in values:
            self.add(v)

    def merge(self, other: CategorySketch) -> None:
        for k, c in other.counts.items():
            self.add(k, c)

    @property
    def count(self) -> float:
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        return {"type": "categorical", "counts": dict(self.counts)}

    @classmethod
    def from_json(cls, data: Any, max_categories: int = 256) -> CategorySketch:
        try:
            counts = {str(k): float(c) for k, c in data["counts"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SketchError(f"not a categorical sketch: {exc!r}") from None
        if any(c < 0 or not math.isfinite(c) for c in counts.values()):
            raise SketchError("categorical sketch counts must be finite and non-negative")
        s = cls(max_categories)
        for k, c in counts.items():
            s.add(k, c)
        return s


Sketch = NumericSketch | CategorySketch


def sketch_from_json(data: Any) -> Sketch:
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "numeric":
        return NumericSketch.from_json(data)
    if kind == "categorical":
        return CategorySketch.from_json(data)
    raise SketchError(f"sketch type must be 'numeric' or 'categorical', got {kind!r}")
