"""Drift statistics between a reference and a current distribution, without scipy at run time.

Numbers arrive as weighted samples ``(values, weights)`` (raw arrays have weight 1; a sketch's
buckets carry their counts), so one implementation serves exact checks and streaming sketches.
Definitions follow the references the tests compare against: KS statistic and Wasserstein-1 as
``scipy.stats.ks_2samp`` / ``wasserstein_distance``, the KS p-value from the asymptotic
Kolmogorov distribution (``scipy.stats.kstwobign``), Jensen-Shannon as the base-2 *distance* of
``scipy.spatial.distance.jensenshannon``, chi-squared as ``scipy.stats.chisquare`` of the current
counts against the reference proportions, and PSI as the symmetric KL sum over reference bins.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
#: floor of an empty bin's share in PSI and of an unseen category's expected count (as Evidently)
EPS = 1e-4


def _weighted(values: Array, weights: Array | None) -> tuple[Array, Array]:
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if v.shape != w.shape or v.ndim != 1:
        raise ValueError("values and weights must be 1-d arrays of the same length")
    keep = np.isfinite(v) & (w > 0)
    if not keep.any():
        raise ValueError("a distribution needs at least one finite value")
    order = np.argsort(v[keep], kind="stable")
    return v[keep][order], w[keep][order]


def _cdfs(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array, Array]:
    """Both right-continuous CDFs evaluated on the union of support points."""
    grid = np.union1d(a[0], b[0])
    out = []
    for v, w in (a, b):
        cw = np.cumsum(w) / w.sum()
        idx = np.searchsorted(v, grid, side="right")
        out.append(np.where(idx > 0, cw[np.maximum(idx - 1, 0)], 0.0))
    return grid, out[0], out[1]


def ks_statistic(ref: Array, cur: Array, ref_w: Array | None = None, cur_w: Array | None = None) -> float:
    _, fa, fb = _cdfs(_weighted(ref, ref_w), _weighted(cur, cur_w))
    return float(np.max(np.abs(fa - fb)))


def kolmogorov_sf(x: float) -> float:
    """Survival function of the limiting Kolmogorov distribution (``scipy.stats.kstwobign.sf``)."""
    if x <= 0:
        return 1.0
    if x < 1.18:  # the alternating series converges slowly here: use the theta-function form
        t = math.pi**2 / (8.0 * x * x)
        cdf = math.sqrt(2.0 * math.pi) / x * sum(math.exp(-((2 * k - 1) ** 2) * t) for k in range(1, 20))
        return max(0.0, 1.0 - cdf)
    terms = (float((-1) ** (k - 1)) * math.exp(-2.0 * k * k * x * x) for k in range(1, 101))
    return max(0.0, 2.0 * math.fsum(terms))


def ks_test(
    ref: Array, cur: Array, ref_w: Array | None = None, cur_w: Array | None = None
) -> tuple[float, float]:
    """(statistic, asymptotic two-sided p-value), sample sizes taken as the weight totals."""
    a, b = _weighted(ref, ref_w), _weighted(cur, cur_w)
    _, fa, fb = _cdfs(a, b)
    d = float(np.max(np.abs(fa - fb)))
    n, m = float(a[1].sum()), float(b[1].sum())
    return d, kolmogorov_sf(d * math.sqrt(n * m / (n + m)))


def wasserstein(ref: Array, cur: Array, ref_w: Array | None = None, cur_w: Array | None = None) -> float:
    grid, fa, fb = _cdfs(_weighted(ref, ref_w), _weighted(cur, cur_w))
    return float(np.sum(np.abs(fa - fb)[:-1] * np.diff(grid)))


def wasserstein_normed(
    ref: Array, cur: Array, ref_w: Array | None = None, cur_w: Array | None = None
) -> float:
    """Wasserstein-1 in units of the reference's standard deviation (scale-free, as Evidently)."""
    v, w = _weighted(ref, ref_w)
    mean = float(np.average(v, weights=w))
    std = math.sqrt(float(np.average((v - mean) ** 2, weights=w)))
    dist = wasserstein(ref, cur, ref_w, cur_w)
    if std == 0:
        return 0.0 if dist == 0 else math.inf
    return dist / std


def quantile_edges(ref: Array, ref_w: Array | None = None, bins: int = 10) -> Array:
    """Inner bin edges at the reference's weighted quantiles (duplicates removed)."""
    v, w = _weighted(ref, ref_w)
    cw = np.cumsum(w) / w.sum()
    qs = np.arange(1, bins) / bins
    edges = v[np.minimum(np.searchsorted(cw, qs, side="left"), len(v) - 1)]
    return np.unique(edges)


def binned(values: Array, weights: Array | None, edges: Array) -> Array:
    """Shares of the weight in the bins ``(-inf, e0], (e0, e1], ..., (e_last, inf)``."""
    v, w = _weighted(values, weights)
    idx = np.searchsorted(edges, v, side="left")
    counts: Array = np.bincount(idx, weights=w, minlength=len(edges) + 1).astype(np.float64)
    return counts / float(counts.sum())


def psi(ref_share: Array, cur_share: Array) -> float:
    """Population stability index of two binned distributions (empty bins floored at EPS)."""
    p = np.clip(np.asarray(ref_share, dtype=np.float64), EPS, None)
    q = np.clip(np.asarray(cur_share, dtype=np.float64), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def jensen_shannon(p_share: Array, q_share: Array) -> float:
    """Jensen-Shannon distance, base 2 (0 identical … 1 disjoint)."""
    p = np.asarray(p_share, dtype=np.float64)
    q = np.asarray(q_share, dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)

    def kl(a: Array) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return math.sqrt(max(0.0, 0.5 * kl(p) + 0.5 * kl(q)))


def chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-squared distribution (regularised upper incomplete gamma)."""
    if dof < 1:
        raise ValueError("degrees of freedom must be at least 1")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    lg = math.lgamma(a)
    if z < a + 1.0:  # series for the lower function
        term = total = 1.0 / a
        k = a
        for _ in range(10_000):
            k += 1.0
            term *= z / k
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - lg))
    b, c, d = z + 1.0 - a, 1.0 / 1e-300, 1.0 / (z + 1.0 - a)  # Lentz's continued fraction
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(-z + a * math.log(z) - lg) * h)


def chi_squared(ref_counts: dict[str, float], cur_counts: dict[str, float]) -> tuple[float, float]:
    """(statistic, p-value) of the current counts against the reference's proportions."""
    cats = sorted(set(ref_counts) | set(cur_counts))
    if len(cats) < 2:
        return 0.0, 1.0
    ref = np.array([ref_counts.get(c, 0.0) for c in cats])
    cur = np.array([cur_counts.get(c, 0.0) for c in cats])
    if not ref.sum() > 0 or not cur.sum() > 0:
        raise ValueError("both distributions need at least one observation")
    expected = np.clip(ref / ref.sum(), EPS, None)
    expected = expected / expected.sum() * cur.sum()
    stat = float(np.sum((cur - expected) ** 2 / expected))
    return stat, chi2_sf(stat, len(cats) - 1)
