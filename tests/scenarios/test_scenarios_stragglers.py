"""The scenario suite (see test_scenario_suite.py), family stragglers:
stragglers: many at once, one that worsens, and a rank slowed by its GPU's fault while the job
learns its speeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.suite import HERE, check_every_fault_detected_and_nothing_serious_unexplained, family, run

pytestmark = pytest.mark.long


@pytest.mark.parametrize("path", family("stragglers"))
def test_every_fault_is_detected_and_nothing_serious_is_unexplained(path: Path) -> None:
    check_every_fault_detected_and_nothing_serious_unexplained(path)


def test_a_worsening_straggler_is_one_alert_that_follows_it() -> None:
    result = run(HERE / "training-worsening-straggler.yaml")
    mine = [
        a
        for a in result.alerts
        if a.rule == "training_straggler" and a.entity.get("job") == "wide" and a.entity.get("rank") == "11"
    ]
    assert len(mine) == 1, [a.to_dict() for a in mine]
    alert = mine[0]
    assert 400 <= alert.started_at <= 1000 and alert.resolved_at is None
    # 1.2x: about 0.15 of a step behind; 3.6x: about 0.7 of the (longer) step
    assert alert.value is not None and alert.value >= 0.5, alert.to_dict()
    # the worsening at 1000 is told again (a stage), not only read in the alert's value
    assert [(1000 <= w["at"] <= 1100, w["stage"]) for w in alert.details["worsened"]] == [(True, 1)]
    # the job's pace: one alert from the first slowdown, told again at the second, still open
    (pace,) = [a for a in result.alerts if a.rule == "step_time_regression" and a.entity == {"job": "wide"}]
    assert pace.firing and [(1000 <= w["at"] <= 1100) for w in pace.details["worsened"]] == [True]


def test_a_gpu_fault_in_the_warm_up_is_no_slow_placement() -> None:
    result = run(HERE / "training-warmup-throttle.yaml")
    assert not [a.to_dict() for a in result.alerts if a.rule == "slow_placement"]
    hot = [a for a in result.alerts if a.rule == "gpu_thermal_throttle"]
    assert [(a.entity["node"], a.entity["gpu"]) for a in hot] == [("node-1", "1")]
    # its rank straggles while the throttle lasts; after the restart it is held, not a placement
    slow = [a for a in result.alerts if a.rule == "training_straggler"]
    assert {a.entity["rank"] for a in slow} <= {"5"}, [a.to_dict() for a in slow]
