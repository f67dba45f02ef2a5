"""The scenario suite: every fault kind the simulator injects, in virtual time, through the hub.

Each scenario file lists its faults (the ground truth); the run must detect every one with its
rule on its target within its window, raise no P1/P2 alert that no fault explains, keep precision
at 0.95 or better and find hard faults within the time budget (p95 <= 15 s). Healthy scenarios
must raise nothing at P1/P2. In every run the productivity model's GPU-hours per state are within
2 % of all GPU-hours of the simulator's ground truth. The 24 simulated hours of
``healthy/healthy-6h-*.yaml`` and the long runs of ``long/`` take minutes each, so ``make test``
runs the one-hour healthy scenario and a shorter scenario of each family, and the evaluation job
(``make eval``: ``eval/eval_families.py``) runs them all.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from gpuscope.sim.kinds import FAULT_KINDS, rule_for_fault
from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.gpu_hours import compare
from gpuscope.simeval.report import evaluate
from gpuscope.simeval.runner import RunResult, run_scenario

HERE = Path(__file__).parent
FAULTY = sorted(HERE.glob("*.yaml"))
HEALTHY_CI = HERE / "healthy" / "healthy-1h-ci.yaml"


@cache
def _run(path: Path) -> RunResult:
    """Each scenario is simulated once per session, however many tests read its alerts."""
    return run_scenario(load_scenario(path))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FAULTY])
def test_every_fault_is_detected_and_nothing_serious_is_unexplained(path: Path) -> None:
    result = _run(path)
    scenario = result.scenario
    report = evaluate(scenario, result.alerts)
    missed = [(o.fault.kind, o.fault.at, o.fault.target) for o in report.outcomes if o.alert_id is None]
    assert not missed, missed
    assert not report.false_p1p2, [a.to_dict() for a in report.false_p1p2]
    assert report.precision >= 0.95, [a.to_dict() for a in report.unexplained]
    p95 = report.percentile(0.95)
    assert p95 is None or p95 <= 15.0, report.ttd_hard
    hours = compare(result.measured_gpu_hours, result.true_gpu_hours)  # vs the simulator's truth
    assert hours["max_error_pct"] <= 2.0, hours


def test_healthy_hour_raises_no_alert() -> None:
    scenario = load_scenario(HEALTHY_CI)
    result = run_scenario(scenario)
    assert not scenario.faults
    assert not [a.to_dict() for a in result.alerts if a.severity in ("P1", "P2")]
    hours = compare(result.measured_gpu_hours, result.true_gpu_hours)
    assert hours["max_error_pct"] <= 2.0, hours


def test_suite_covers_every_simulated_fault_kind_and_every_rule_they_raise() -> None:
    kinds = {f.kind for path in FAULTY for f in load_scenario(path).faults}
    simulated = {name for name, kind in FAULT_KINDS.items() if kind.simulated}
    assert simulated <= kinds, sorted(simulated - kinds)
    rules = {rule_for_fault(f.kind, f.params) for path in FAULTY for f in load_scenario(path).faults}
    expected = {FAULT_KINDS[k].rule for k in simulated} | {"gpu_xid_fatal", "gpu_xid_app"}
    assert expected <= rules, sorted(expected - rules)


def test_healthy_scenarios_total_at_least_a_day() -> None:
    seconds = sum(load_scenario(p).duration for p in (HERE / "healthy").glob("healthy-6h-*.yaml"))
    assert seconds >= 24 * 3600


def test_a_worsening_straggler_is_one_alert_that_follows_it() -> None:
    result = _run(HERE / "training-worsening-straggler.yaml")
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


def test_steady_high_load_is_quiet_and_pressure_that_slows_requests_is_p2() -> None:
    result = _run(HERE / "serving-steady-kv.yaml")
    busy = [a.to_dict() for a in result.alerts if a.entity.get("service") in ("busy-a", "busy-b")]
    assert not busy
    kv = [a for a in result.alerts if a.rule == "kv_cache_pressure"]
    assert [(a.entity, a.severity) for a in kv] == [({"service": "quiet"}, "P2")]
