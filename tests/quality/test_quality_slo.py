"""Error budgets: burn rates per window, the multi-window pairs, config parsing, and the hub monitor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.model import Batch, Event, Frame
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.sketch import NumericSketch
from gpuscope.quality.slo import BurnRates, Slo, slos_from_config


def test_burn_rates_and_pairs() -> None:
    br = BurnRates(Slo("chat", "availability", 0.999))
    for t in range(0, 6 * 3600, 30):  # six healthy hours: 0.05 % errors = half the budget
        br.add(float(t), 10_000, 5)
    healthy = br.evaluate(6 * 3600.0)
    assert healthy["windows"]["1h"] == pytest.approx(0.5) and not any(healthy["alerts"].values())
    for t in range(6 * 3600, 6 * 3600 + 600, 30):  # ten minutes at 2 % errors: 20x burn
        br.add(float(t), 10_000, 200)
    now = 6 * 3600.0 + 600
    burst = br.evaluate(now)
    assert burst["windows"]["5m"] == pytest.approx(20.0)
    # the hour is the 119 whole slots after now - 1 h: 99 healthy, 20 burning
    assert burst["windows"]["1h"] == pytest.approx((99 * 5 + 20 * 200) / (119 * 10_000) / 0.001)
    assert burst["alerts"] == {"page_fast": False, "page_slow": False, "ticket": True}
    assert math.isnan(br.burn_rate(1e9, 300))  # no traffic: no burn rate
    with pytest.raises(ValueError, match="bad"):
        br.add(0.0, 5, 6)


def test_slo_config() -> None:
    slos = slos_from_config(
        [{"service": "chat", "availability": 0.999, "latency": {"threshold_seconds": 0.5, "objective": 0.99}}]
    )
    assert [(s.kind, s.objective, s.threshold_seconds) for s in slos] == [
        ("availability", 0.999, None),
        ("latency", 0.99, 0.5),
    ]
    with pytest.raises(ValueError, match=r"slos\[0\].*unknown"):
        slos_from_config([{"service": "x", "availabilty": 0.9}])
    with pytest.raises(ValueError, match=r"slos\[0\]\.availability: must be a number within \(0, 1\)"):
        slos_from_config([{"service": "x", "availability": 1.5}])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (5, "slos[0]: must be a mapping"),
        ({"availability": 0.9}, "slos[0].service: needs the service's name"),
        ({"service": "x"}, "slos[0]: needs availability, latency or both"),
        ({"service": "x", "availability": "abc"}, "slos[0].availability: must be a number within (0, 1)"),
        ({"service": "x", "latency": 0.5}, "slos[0].latency: must be a mapping"),
        ({"service": "x", "latency": {"objective": 0.99}}, "slos[0].latency.threshold_seconds: is required"),
        (
            {"service": "x", "latency": {"objective": 0.99, "threshold": 0.5}},
            "slos[0].latency.threshold: unknown key (known: objective, threshold_seconds)",
        ),
        (
            {"service": "x", "latency": {"objective": 0.99, "threshold_seconds": -1}},
            "slos[0].latency.threshold_seconds: must be a positive number of seconds",
        ),
        (
            {"service": "x", "latency": {"objective": True, "threshold_seconds": 0.5}},
            "slos[0].latency.objective: must be a number within (0, 1)",
        ),
    ],
)
def test_a_bad_slo_entry_names_its_key(entry: object, message: str) -> None:
    """Seen: ``'float' object is not subscriptable``, ``slos[0]: 'threshold_seconds'`` and a typo
    inside ``latency:`` accepted; an entry with neither objective was kept as no SLO at all."""
    with pytest.raises(ValueError) as exc:
        slos_from_config([entry])
    assert str(exc.value).startswith(message)


def test_monitor_latency_burn_and_business_baseline() -> None:
    mon = QualityMonitor([Slo("chat", "latency", 0.99, 0.2)])
    lat = NumericSketch()
    lat.extend([0.1] * 90 + [0.5] * 10)  # 10 % slower than 0.2 s: 10x the 1 % budget
    ev = Event(
        100.0,
        "serving_window",
        {"service": "chat", "version": "v2"},
        {"requests": 102, "errors": 2, "latency": lat.to_json()},
    )
    out = mon.observe(Batch("sdk", events=[ev]))
    assert out is not None
    rates = {
        f.entities[0].get("window"): f.values[0, 0] for f in out.frames if f.metrics == ["slo_burn_rate"]
    }
    assert rates["5m"] == pytest.approx(12 / 102 / 0.01)
    frames = [
        Frame(t, ["model_business_metric"], [{"service": "chat", "metric": "ctr"}], np.array([[v]]))
        for t, v in ((0.0, 0.1), (60.0, 0.1), (120.0, 0.05))
    ]
    ratios = [mon.observe(Batch("sdk", frames=[f])).frames[0] for f in frames]  # type: ignore[union-attr]
    last = ratios[-1]
    assert last.values[0, last.metrics.index("model_business_metric_ratio")] == pytest.approx(0.5)
    bad = Event(1.0, "quality_sketch", {"service": "chat", "signal": "input"}, {"sketch": {"type": "x"}})
    assert (
        mon.observe(Batch("sdk", events=[bad])) is None
        and mon.counters.snapshot()["quality_refused_sketches"] == 1
    )
