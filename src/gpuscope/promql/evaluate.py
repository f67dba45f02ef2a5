"""Evaluation of the PromQL subset over a store, at every step of a range at once.

A vector is a mapping from a series' labels to one value per evaluation time (NaN: absent), a
scalar one value per time. Each selector reads its series once, over the whole range plus its
window and the lookback, through the store's ``snapshot`` (which series exist) and ``series``
(their points). Rates are the increase between the first and last sample of the window divided by
the time between them (counter resets corrected, no extrapolation to the window's edges).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gpuscope.promql.parse import Aggregate, Binary, Call, Expr, Number, PromQLError, Selector
from gpuscope.store.base import SeriesPoint

Array = npt.NDArray[np.float64]
LabelKey = tuple[tuple[str, str], ...]
Vector = dict[LabelKey, Array]
LOOKBACK_S = 300.0  # Prometheus' default: an instant selector sees a sample this old at most
MAX_POINTS = 11_000  # Prometheus' limit of points per series in a range query


class SeriesSource(Protocol):
    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]: ...

    def series(
        self, metric: str, labels: dict[str, str], start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]: ...


def matches(labels: dict[str, str], matchers: tuple[tuple[str, str, str], ...]) -> bool:
    """Prometheus' matcher semantics: a missing label is the empty string; regexes are anchored."""
    for name, op, value in matchers:
        have = labels.get(name, "")
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
        if op in ("=~", "!~"):
            try:
                hit = re.fullmatch(value, have) is not None
            except re.error as exc:
                raise PromQLError(f"{name}{op}{value!r}: not a regular expression: {exc}") from None
            if hit != (op == "=~"):
                return False
    return True


def _key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _drop_name(key: LabelKey) -> LabelKey:
    return tuple(kv for kv in key if kv[0] != "__name__")


def _windows(ts: Array, times: Array, width: float) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per evaluation time, the index range [lo, hi) of samples in (t - width, t]."""
    lo = np.searchsorted(ts, times - width, side="right")
    hi = np.searchsorted(ts, times, side="right")
    return lo.astype(np.int64), hi.astype(np.int64)


def _reduce(
    values: Array, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], fn: Callable[[Array], float]
) -> Array:
    return np.array([fn(values[a:b]) if b > a else math.nan for a, b in zip(lo, hi, strict=True)])


def _over_time(func: str, ts: Array, vals: Array, times: Array, width: float, q: Array | None) -> Array:
    lo, hi = _windows(ts, times, width)
    n = hi - lo
    if func in ("rate", "increase", "irate", "delta"):
        drops = np.concatenate(([0.0], np.maximum(0.0, vals[:-1] - vals[1:])))
        corrected = vals + (np.cumsum(drops) if func != "delta" else 0.0)
        ok = n >= 2
        first = np.where(ok, lo, 0) if func != "irate" else np.where(ok, hi - 2, 0)
        last = np.where(ok, hi - 1, 0)
        span = ts[last] - ts[first]
        change = corrected[last] - corrected[first]
        out = change / np.where(span > 0, span, math.nan) if func in ("rate", "irate") else change
        return np.where(ok, out, math.nan)
    if func == "count_over_time":
        return np.where(n > 0, n.astype(np.float64), math.nan)
    if func == "last_over_time":
        return np.where(n > 0, vals[np.maximum(hi - 1, 0)], math.nan)
    if func == "quantile_over_time":
        assert q is not None
        return np.array(
            [
                float(np.quantile(vals[a:b], min(max(float(p), 0.0), 1.0)))
                if b > a and not math.isnan(p)
                else math.nan
                for a, b, p in zip(lo, hi, q, strict=True)
            ]
        )
    reducers: dict[str, Callable[[Array], float]] = {
        "avg_over_time": lambda v: float(v.mean()),
        "min_over_time": lambda v: float(v.min()),
        "max_over_time": lambda v: float(v.max()),
        "sum_over_time": lambda v: float(v.sum()),
    }
    return _reduce(vals, lo, hi, reducers[func])


_ARITH: dict[str, Callable[[Array, Array], Array]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": lambda a, b: (
        np.divide(a, b, out=np.full_like(a, math.nan), where=b != 0)
        + np.where(b == 0, np.where(a == 0, math.nan, np.sign(a) * math.inf), 0.0)
    ),
}
_COMPARE: dict[str, Callable[[Array, Array], npt.NDArray[np.bool_]]] = {
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    "<": np.less,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}
_AGGREGATE: dict[str, Callable[[Array], Array]] = {
    "sum": lambda m: np.nansum(m, axis=0),
    "avg": lambda m: np.nanmean(m, axis=0),
    "min": lambda m: np.nanmin(m, axis=0),
    "max": lambda m: np.nanmax(m, axis=0),
    "count": lambda m: np.sum(~np.isnan(m), axis=0).astype(np.float64),
}


class Evaluator:
    """Evaluates expressions at ``times`` (one for an instant query, every step for a range)."""

    def __init__(self, source: SeriesSource, times: Array, step_s: float) -> None:
        self.source = source
        self.times = times
        self.step_s = step_s

    def fetch(self, sel: Selector, width: float) -> list[tuple[LabelKey, Array, Array]]:
        """The selector's series: (labels with __name__, timestamps, values) over the range and window."""
        start = float(self.times[0]) - width
        end = float(self.times[-1])
        resolution = max(1.0, min(self.step_s, width) / 4.0)
        points = int(min(MAX_POINTS, max(1, math.ceil((end - start) / resolution))))
        out = []
        for row in self.source.snapshot([sel.metric], None):
            labels: dict[str, str] = {str(k): str(v) for k, v in row["labels"].items()}
            if not matches({**labels, "__name__": sel.metric}, sel.matchers):
                continue
            got = self.source.series(sel.metric, labels, start, end, points)
            if got:
                ts = np.fromiter((p.ts for p in got), np.float64, len(got))
                vals = np.fromiter((p.value for p in got), np.float64, len(got))
                out.append((_key({**labels, "__name__": sel.metric}), ts, vals))
        return out

    def scalar_or_vector(self, expr: Expr) -> Array | Vector:
        if isinstance(expr, Number):
            return np.full(len(self.times), expr.value)
        if isinstance(expr, Selector):
            if expr.range_s is not None:
                raise PromQLError("a range selector is only allowed inside a function such as rate()")
            vector: Vector = {}
            for key, ts, vals in self.fetch(expr, LOOKBACK_S):
                idx = np.searchsorted(ts, self.times, side="right") - 1
                fresh = (idx >= 0) & (self.times - ts[np.maximum(idx, 0)] <= LOOKBACK_S)
                vector[key] = np.where(fresh, vals[np.maximum(idx, 0)], math.nan)
            return vector
        if isinstance(expr, Call):
            return self.call(expr)
        if isinstance(expr, Aggregate):
            return self.aggregate(expr)
        return self.binary(expr)

    def call(self, expr: Call) -> Array | Vector:
        if expr.func == "abs":
            inner = self.scalar_or_vector(expr.args[0])
            if isinstance(inner, dict):
                return {_drop_name(k): np.abs(v) for k, v in inner.items()}
            return np.abs(inner)
        sel = expr.args[-1]
        assert isinstance(sel, Selector) and sel.range_s is not None  # checked by the parser
        q: Array | None = None
        if expr.func == "quantile_over_time":
            param = self.scalar_or_vector(expr.args[0])
            if isinstance(param, dict):
                raise PromQLError("quantile_over_time: the quantile must be a number")
            q = param
        out: Vector = {}
        for key, ts, vals in self.fetch(sel, sel.range_s):
            key = key if expr.func == "last_over_time" else _drop_name(key)
            out[key] = _over_time(expr.func, ts, vals, self.times, sel.range_s, q)
        return out

    def aggregate(self, expr: Aggregate) -> Vector:
        inner = self.scalar_or_vector(expr.expr)
        if not isinstance(inner, dict):
            raise PromQLError(f"{expr.op}: needs a vector, got a number")
        groups: dict[LabelKey, list[Array]] = {}
        for key, values in inner.items():
            if expr.without:
                group = tuple(kv for kv in key if kv[0] not in expr.grouping and kv[0] != "__name__")
            else:
                group = tuple(kv for kv in key if kv[0] in expr.grouping)
            groups.setdefault(group, []).append(values)
        out: Vector = {}
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # all-NaN columns (no member present at a time) are NaN by design, not worth a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            for group, members in groups.items():
                stacked = np.vstack(members)
                present = np.any(~np.isnan(stacked), axis=0)
                out[group] = np.where(present, _AGGREGATE[expr.op](stacked), math.nan)
        return out

    def binary(self, expr: Binary) -> Array | Vector:
        lhs, rhs = self.scalar_or_vector(expr.lhs), self.scalar_or_vector(expr.rhs)
        compare = expr.op in _COMPARE
        if not isinstance(lhs, dict) and not isinstance(rhs, dict):
            if compare:
                raise PromQLError(f"comparison {expr.op} between two numbers needs the bool modifier")
            with np.errstate(all="ignore"):
                return _ARITH[expr.op](lhs, rhs)
        if isinstance(lhs, dict) and isinstance(rhs, dict):
            right = {_drop_name(k): v for k, v in rhs.items()}
            pairs = [(k, v, right.get(_drop_name(k))) for k, v in lhs.items()]
            return self._apply(expr.op, [(k, a, b) for k, a, b in pairs if b is not None])
        if isinstance(lhs, dict):
            assert not isinstance(rhs, dict)
            return self._apply(expr.op, [(k, v, rhs) for k, v in lhs.items()])
        assert isinstance(rhs, dict)
        if compare:  # the vector's samples are kept where the comparison holds
            flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(expr.op, expr.op)
            return self._apply(flipped, [(k, v, lhs) for k, v in rhs.items()])
        return {_drop_name(k): _ARITH[expr.op](lhs, v) for k, v in rhs.items()}

    def _apply(self, op: str, rows: list[tuple[LabelKey, Array, Array]]) -> Vector:
        with np.errstate(all="ignore"):
            if op in _COMPARE:
                return {k: np.where(_COMPARE[op](a, b), a, math.nan) for k, a, b in rows}
            return {_drop_name(k): _ARITH[op](a, b) for k, a, b in rows}
