"""The shared rolling-baseline library and the liveness tracker."""

from __future__ import annotations

import math

import pytest

from gpuscope.detect.baseline import (
    Ewma,
    FlagWindow,
    IntervalEstimator,
    RollingMedian,
    finite_or_none,
    median,
)
from gpuscope.detect.liveness import Liveness

NAN, INF = math.nan, math.inf


def test_median_ignores_non_finite_values() -> None:
    assert median([3.0, NAN, 1.0, INF, 2.0]) == 2.0
    assert median([4.0, 1.0, NAN, 3.0, 2.0]) == 2.5
    assert math.isnan(median([NAN]))


def test_rolling_median_window_mad_and_robust_z() -> None:
    rm = RollingMedian(5)
    assert math.isnan(rm.median()) and math.isnan(rm.robust_z(1.0))
    for x in [10.0, 11.0, NAN, 9.0, 10.0, 100.0, 10.0, 11.0]:
        rm.push(x)
    assert len(rm) == 5  # NaN was refused; the oldest values fell out
    assert rm.median() == 10.0 and rm.max() == 100.0 and rm.mad() == 1.0
    assert rm.robust_z(10.0) == 0.0 and rm.robust_z(20.0) == pytest.approx(10 / 1.4826)
    with pytest.raises(ValueError, match="at least 1"):
        RollingMedian(0)


def test_ewma_mean_variance_and_zscore() -> None:
    e = Ewma(alpha=0.5)
    assert math.isnan(e.zscore(1.0))
    for x in [2.0, 4.0, NAN, 4.0]:
        e.push(x)
    assert e.count == 3 and e.mean == pytest.approx(3.5)
    assert e.var == pytest.approx(0.75) and e.zscore(3.5) == 0.0
    h = Ewma.from_halflife(1.0)
    assert h.alpha == pytest.approx(0.5)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            Ewma(bad)


def test_interval_estimator_learns_the_period_and_ignores_repeats_and_outages() -> None:
    est = IntervalEstimator()
    assert est.interval is None
    for ts in [0.0, 1.0, 1.0, 0.5, 2.1, 2.9, 60.0, 61.0, 62.0]:
        est.push(ts)
    assert est.reports == 7 and est.last == 62.0
    assert est.interval == pytest.approx(1.0)


def test_flag_window_weights_by_time_and_slides() -> None:
    w = FlagWindow(window=10.0, max_step=2.0)
    w.push(0.0, True, step=1.0)
    for t in range(1, 6):
        w.push(float(t), True)
    assert w.held == pytest.approx(6.0) and w.fraction() == pytest.approx(0.6)
    w.push(30.0, False)  # a 24 s gap counts for at most max_step, and the old samples slide out
    assert w.held == 0.0 and not w.any_flag() and w.observed == pytest.approx(2.0)
    w.push(29.0, True)  # out of order: ignored
    assert w.last == 30.0
    with pytest.raises(ValueError, match="positive"):
        FlagWindow(window=0)


def test_finite_or_none() -> None:
    assert [finite_or_none(x) for x in (1.5, NAN, INF, None)] == [1.5, None, None, None]


def test_liveness_learns_thresholds_and_excuses_hub_gaps() -> None:
    live: Liveness[str] = Liveness(factor=4.0, floor=4.0, min_reports=2)
    for t in range(10):
        for name in ("a", "b", "c"):
            live.beat(name, float(t))
        assert live.overdue(float(t)) == []
    assert live.threshold("a") == 4.0 and live.heard_at("a") == 9.0 and "b" in live
    for t in range(10, 40):  # a falls silent, b and c go on
        live.beat("b", float(t))
        live.beat("c", float(t))
        late = live.overdue(float(t))
        assert [x.key for x in late] == (["a"] if t >= 13 else [])
    assert [x.key for x in live.overdue(50.0)] == ["a"]  # a hub gap: a stays overdue, b and c are excused
    assert live.in_gap and live.suppressed == 2
    live.beat("b", 50.0)
    late = live.overdue(51.0)
    assert [x.key for x in late] == ["a"] and not live.in_gap and live.gap_end == 51.0
    for t in range(52, 55):
        live.beat("b", float(t))
        assert [x.key for x in live.overdue(float(t))] == ["a"]  # c's silence counts from the gap's end
    live.beat("b", 55.0)
    assert [x.key for x in live.overdue(55.0)] == ["a", "c"]
    live.forget("a")
    assert list(live.keys()) == ["b", "c"]


def test_liveness_with_a_default_interval_judges_after_one_report() -> None:
    live: Liveness[int] = Liveness(default_interval=1.0)
    live.beat(1, 100.0)
    live.traffic()
    assert live.overdue(0.0) == [] and live.threshold(1) == 4.0
    assert [x.key for x in live.overdue(4.0)] == [1]
    with pytest.raises(ValueError, match="factor"):
        Liveness(factor=0)
