"""Drift statistics against scipy: exact on raw samples, within the sketch's error on sketches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from scipy.spatial.distance import jensenshannon

from gpuscope.quality import stats
from gpuscope.quality.drift import choose_method, drift
from gpuscope.quality.sketch import CategorySketch, NumericSketch, SketchError, sketch_from_json

RNG = np.random.default_rng(5)
REF = RNG.normal(0.0, 1.0, 3000)
CUR = RNG.normal(0.4, 1.3, 2000)


def sketch(values: np.ndarray, alpha: float = 0.01) -> NumericSketch:
    s = NumericSketch(alpha=alpha)
    s.extend(values)
    return s


@pytest.mark.parametrize("shift", [0.0, 0.1, 0.5, 2.0])
def test_ks_and_wasserstein_equal_scipy_on_samples(shift: float) -> None:
    cur = CUR + shift
    want = sps.ks_2samp(REF, cur)
    assert stats.ks_statistic(REF, cur) == pytest.approx(want.statistic, abs=1e-12)
    d, p = stats.ks_test(REF, cur)
    assert d == pytest.approx(want.statistic, abs=1e-12)
    assert p == pytest.approx(sps.ks_2samp(REF, cur, method="asymp").pvalue, rel=0.05, abs=1e-6)
    assert stats.wasserstein(REF, cur) == pytest.approx(sps.wasserstein_distance(REF, cur), rel=1e-10)
    assert stats.wasserstein_normed(REF, cur) == pytest.approx(
        sps.wasserstein_distance(REF, cur) / np.std(REF), rel=1e-10
    )


def test_weighted_wasserstein_equals_scipy() -> None:
    u, v = RNG.uniform(0, 5, 50), RNG.uniform(1, 6, 70)
    uw, vw = RNG.uniform(0.1, 3, 50), RNG.uniform(0.1, 3, 70)
    want = sps.wasserstein_distance(u, v, uw, vw)
    assert stats.wasserstein(u, v, uw, vw) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("x", [0.2, 0.5, 0.9, 1.1, 1.2, 1.5, 2.5, 4.0])
def test_kolmogorov_sf_equals_scipy(x: float) -> None:
    assert stats.kolmogorov_sf(x) == pytest.approx(sps.kstwobign.sf(x), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize(("x", "dof"), [(0.5, 1), (3.0, 2), (12.0, 5), (40.0, 9), (200.0, 30), (7.0, 60)])
def test_chi2_sf_equals_scipy(x: float, dof: int) -> None:
    assert stats.chi2_sf(x, dof) == pytest.approx(sps.chi2.sf(x, dof), rel=1e-9, abs=1e-300)


def test_chi_squared_equals_scipy_chisquare() -> None:
    ref = {"cat": 400.0, "dog": 350.0, "bird": 250.0}
    cur = {"cat": 300.0, "dog": 420.0, "bird": 280.0}
    cats = sorted(ref)
    f_obs = np.array([cur[c] for c in cats])
    f_exp = np.array([ref[c] for c in cats]) / sum(ref.values()) * f_obs.sum()
    want = sps.chisquare(f_obs, f_exp)
    stat, p = stats.chi_squared(ref, cur)
    assert stat == pytest.approx(want.statistic, rel=1e-10)
    assert p == pytest.approx(want.pvalue, rel=1e-8)


def test_jensen_shannon_and_psi_equal_scipy() -> None:
    edges = stats.quantile_edges(REF)
    p, q = stats.binned(REF, None, edges), stats.binned(CUR, None, edges)
    assert stats.jensen_shannon(p, q) == pytest.approx(jensenshannon(p, q, base=2), rel=1e-10)
    # PSI is the symmetric Kullback-Leibler sum
    assert stats.psi(p, q) == pytest.approx(sps.entropy(q, p) + sps.entropy(p, q), rel=1e-10)
    assert len(edges) == 9 and p == pytest.approx(np.full(10, 0.1), abs=1e-3)


def test_sketches_agree_with_scipy_on_the_raw_data() -> None:
    ref, cur = sketch(REF), sketch(CUR)
    rv, rw = ref.points()
    cv, cw = cur.points()
    assert stats.ks_statistic(rv, cv, rw, cw) == pytest.approx(sps.ks_2samp(REF, CUR).statistic, abs=0.02)
    assert stats.wasserstein(rv, cv, rw, cw) == pytest.approx(sps.wasserstein_distance(REF, CUR), rel=0.03)
    for q in (0.05, 0.5, 0.95):
        assert ref.quantile(q) == pytest.approx(np.quantile(REF, q), rel=0.03, abs=0.02)
    assert ref.mean == pytest.approx(REF.mean())


def test_sketch_is_bounded_mergeable_and_round_trips() -> None:
    values = RNG.lognormal(0, 3, 20_000)
    small = NumericSketch(alpha=0.01, max_buckets=400)
    small.extend(values)
    assert len(small.pos) <= 400 and small.collapsed > 0 and small.count == 20_000
    assert small.quantile(0.99) == pytest.approx(
        np.quantile(values, 0.99), rel=0.03
    )  # collapsing loses only the low end
    a, b = sketch(REF[:1000]), sketch(REF[1000:])
    a.merge(b)
    whole = sketch(REF).to_json()
    assert a.to_json() | {"sum": 0} == whole | {"sum": 0} and a.total == pytest.approx(whole["sum"])
    assert sketch_from_json(a.to_json()).to_json() == a.to_json()
    a.add(math.nan)
    assert a.invalid == 1 and a.count == len(REF)
    with pytest.raises(SketchError, match="add up"):
        sketch_from_json(a.to_json() | {"count": 5})
    with pytest.raises(SketchError, match="type"):
        sketch_from_json({"type": "tdigest"})
    with pytest.raises(SketchError, match="merge"):
        a.merge(NumericSketch(alpha=0.05))


def test_method_choice_and_drift_verdicts() -> None:
    small_ref, big_ref = sketch(REF[:500]), sketch(REF)
    assert choose_method(small_ref) == "ks" and choose_method(big_ref) == "wasserstein"
    same = drift(big_ref, sketch(RNG.normal(0, 1, 2000)))
    moved = drift(big_ref, sketch(RNG.normal(1.0, 1, 2000)))
    assert same.method == "wasserstein" and not same.drifted and moved.drifted
    assert moved.score > 0.5 > same.score
    ks = drift(small_ref, sketch(RNG.normal(1.0, 1, 300)))
    assert ks.method == "ks" and ks.drifted and ks.p_value is not None and ks.p_value < 1e-6
    assert ks.score == ks.statistic > 0.3
    cats_ref, cats_cur = CategorySketch(), CategorySketch()
    cats_ref.extend(RNG.choice(["a", "b", "c"], 600, p=[0.5, 0.3, 0.2]))
    cats_cur.extend(RNG.choice(["a", "b", "c"], 600, p=[0.2, 0.3, 0.5]))
    chi = drift(cats_ref, cats_cur)
    assert chi.method == "chi_squared" and chi.drifted
    js = drift(cats_ref, cats_cur, method="jensen_shannon")
    assert js.statistic > 0.1 and js.drifted
    assert drift(big_ref, sketch(CUR), method="psi").drifted
    with pytest.raises(ValueError, match="numbers"):
        drift(cats_ref, cats_cur, method="ks")
    with pytest.raises(ValueError, match="both"):
        drift(big_ref, cats_cur)


def test_categories_fold_beyond_the_bound() -> None:
    s = CategorySketch(max_categories=3)
    s.extend(["a", "b", "c", "d", "e", "a"])
    assert s.counts == {"a": 2, "b": 1, "c": 1, "__other__": 2} and s.folded == 2
