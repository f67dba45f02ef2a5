"""Drift of a current sketch against a reference sketch, the method chosen as Evidently does.

Numbers: a small reference (≤ ``small`` observations) gets the KS test (drift when p < 0.05),
a larger one the normalised Wasserstein distance (drift above 0.1), because with many samples a
test flags differences too small to matter. Categories: chi-squared when small (p < 0.05),
Jensen-Shannon distance above (drift above 0.1). PSI (drift above 0.2) can be asked for by name.
The score a hub publishes is the statistic (KS's D, a distance), which grows with the size of
the drift; only chi-squared, whose statistic grows with the sample, publishes ``1 - p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscope.quality import stats
from gpuscope.quality.sketch import CategorySketch, NumericSketch, Sketch

METHODS = ("ks", "wasserstein", "psi", "jensen_shannon", "chi_squared")
THRESHOLDS = {"ks": 0.05, "chi_squared": 0.05, "wasserstein": 0.1, "jensen_shannon": 0.1, "psi": 0.2}
SMALL = 1000


@dataclass(frozen=True, slots=True)
class DriftResult:
    method: str
    statistic: float
    p_value: float | None
    threshold: float
    drifted: bool
    reference_count: float
    current_count: float

    @property
    def score(self) -> float:
        """Rises with the size of the drift: the statistic, or 1 - p for chi-squared."""
        return (
            1.0 - self.p_value
            if self.method == "chi_squared" and self.p_value is not None
            else self.statistic
        )


def choose_method(reference: Sketch, small: int = SMALL) -> str:
    return method_for(isinstance(reference, NumericSketch), reference.count, small)


def method_for(numeric: bool, count: float, small: int = SMALL) -> str:
    """The method for a reference of ``count`` observations: a test when small, a distance above."""
    if count <= small:
        return "ks" if numeric else "chi_squared"
    return "wasserstein" if numeric else "jensen_shannon"


def drift(reference: Sketch, current: Sketch, method: str | None = None, small: int = SMALL) -> DriftResult:
    """Compare two sketches of the same kind; a method that does not fit the kind is an error."""
    if type(reference) is not type(current):
        raise ValueError("reference and current must both be numeric or both categorical")
    if not reference.count or not current.count:
        raise ValueError("drift needs observations in both the reference and the current window")
    method = method or choose_method(reference, small)
    if method not in METHODS:
        raise ValueError(f"unknown drift method {method!r} (one of {', '.join(METHODS)})")
    p_value: float | None = None
    if isinstance(reference, NumericSketch) and isinstance(current, NumericSketch):
        rv, rw = reference.points()
        cv, cw = current.points()
        if method == "ks":
            statistic, p_value = stats.ks_test(rv, cv, rw, cw)
        elif method == "wasserstein":
            statistic = stats.wasserstein_normed(rv, cv, rw, cw)
        elif method in ("psi", "jensen_shannon"):
            edges = stats.quantile_edges(rv, rw)
            p, q = stats.binned(rv, rw, edges), stats.binned(cv, cw, edges)
            statistic = stats.psi(p, q) if method == "psi" else stats.jensen_shannon(p, q)
        else:
            raise ValueError(f"{method} is for categories, not numbers")
    elif isinstance(reference, CategorySketch) and isinstance(current, CategorySketch):
        if method == "chi_squared":
            statistic, p_value = stats.chi_squared(reference.counts, current.counts)
        elif method in ("jensen_shannon", "psi"):
            cats = sorted(set(reference.counts) | set(current.counts))
            p = np.array([reference.counts.get(c, 0.0) for c in cats]) / reference.count
            q = np.array([current.counts.get(c, 0.0) for c in cats]) / current.count
            statistic = stats.jensen_shannon(p, q) if method == "jensen_shannon" else stats.psi(p, q)
        else:
            raise ValueError(f"{method} is for numbers, not categories")
    else:  # pragma: no cover - excluded by the type check above
        raise ValueError("unsupported sketch types")
    threshold = THRESHOLDS[method]
    drifted = p_value < threshold if p_value is not None else statistic > threshold
    return DriftResult(method, statistic, p_value, threshold, drifted, reference.count, current.count)
