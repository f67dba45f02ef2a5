"""The vectorised baseline library: NaN-safe EWMAs, peer medians, CUSUM warm-up, seasonal buckets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.detect.vectors import (
    Cusum,
    SeasonalBaseline,
    VecEwma,
    alpha_for,
    group_max,
    group_median,
    grow_codes,
    quantile,
)


def test_vec_ewma_skips_nan_and_frozen_slots() -> None:
    e = VecEwma()
    e.update(np.array([1.0, 2.0, math.nan]), 0.5)
    e.update(np.array([3.0, math.nan, 5.0]), 0.5, mask=np.array([True, True, True]))
    e.update(np.array([100.0, 100.0, 100.0]), 0.5, mask=np.array([False, True, False]))
    assert e.mean.tolist()[:3] == [2.0, 51.0, 5.0]
    assert e.count.tolist()[:3] == [2.0, 2.0, 1.0]
    assert e.var[0] > 0


def test_group_median_is_per_group_and_ignores_nan_and_ungrouped() -> None:
    values = np.array([1.0, 3.0, 2.0, 10.0, math.nan, 20.0, 7.0])
    groups = np.array([0, 0, 0, 1, 1, 1, -1], dtype=np.intp)
    out = group_median(values, groups)
    assert out[:3].tolist() == [2.0, 2.0, 2.0]
    assert out[3:6].tolist() == [15.0, 15.0, 15.0]
    assert math.isnan(out[6])


def test_cusum_learns_during_warmup_then_flags_a_sustained_shift_not_noise() -> None:
    rng = np.random.default_rng(1)
    c = Cusum(warmup=30)
    assert not any(c.push(1.0 + 0.02 * z) for z in rng.standard_normal(300))
    assert c.push(math.nan) is False
    hits = [c.push(1.06 + 0.02 * z) for z in rng.standard_normal(20)]
    assert hits[-1] and hits.index(True) < 10
    with pytest.raises(ValueError):
        Cusum(warmup=2)


def test_cusum_with_a_minimum_shift_ignores_smaller_ones_and_follows_a_moving_level() -> None:
    rng = np.random.default_rng(2)
    c = Cusum(warmup=30, min_shift=0.08, cap=2.0)
    for z in rng.standard_normal(30):
        c.push(1.0 + 0.01 * z)
    # +3 % is three spreads: a plain CUSUM flags it at once, this one never
    assert not any(c.push(1.03 + 0.01 * z) for z in rng.standard_normal(500))
    hits = [c.push(1.1 + 0.01 * z) for z in rng.standard_normal(5)]
    assert hits[-1] and hits.index(True) <= 2
    # measured from a level that caught up with the shift, the alarm ends within a few values
    # (the evidence is capped at twice the threshold), however long the shift had lasted
    for z in rng.standard_normal(300):
        c.push(1.1 + 0.01 * z, level=1.0)
    assert c.s == 2.0 * c.threshold
    ends = [c.push(1.1 + 0.01 * z, level=1.1) for z in rng.standard_normal(5)]
    assert not ends[-1]
    with pytest.raises(ValueError):
        Cusum(min_shift=-0.1)


def test_seasonal_baseline_expects_the_load_of_the_time_of_day() -> None:
    s = SeasonalBaseline(buckets=24, period=86400.0, alpha=0.2, min_count=3)
    for day in range(4):
        for hour in range(24):
            s.push(day * 86400 + hour * 3600 + 60, 100.0 + 50.0 * (hour >= 12))
    assert s.expected(5 * 86400 + 3 * 3600) == pytest.approx(100.0)
    assert s.expected(5 * 86400 + 15 * 3600) == pytest.approx(150.0)


def test_quantile_and_alpha() -> None:
    assert quantile(np.array([1.0, math.nan, 3.0]), 0.5) == 2.0
    assert math.isnan(quantile(np.array([math.nan]), 0.5))
    assert alpha_for(60.0, 60.0) == pytest.approx(1 - math.exp(-1))
    with pytest.raises(ValueError):
        alpha_for(1.0, 0.0)


def test_group_max_takes_the_masked_values_of_each_group_and_minus_inf_for_none() -> None:
    values = np.array([1.0, 5.0, 3.0, 9.0, 2.0])
    groups = np.array([0, 0, 1, 1, 2], np.intp)
    mask = np.array([True, True, True, False, True])
    assert group_max(values, groups, mask, 4).tolist() == [5.0, 3.0, 2.0, -math.inf]


def test_grow_codes_keeps_the_codes_and_marks_new_slots_none() -> None:
    codes = np.array([2, 0], np.intp)
    grown = grow_codes(codes, 3)
    assert grown[:2].tolist() == [2, 0] and (grown[2:] == -1).all() and len(grown) >= 16
    assert grow_codes(grown, 3) is grown
