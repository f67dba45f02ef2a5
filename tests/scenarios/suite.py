"""The scenario suite's one check and its families, shared by its modules: one module per family,
so that the test workers (``--dist loadfile``) share the suite out instead of one of them running
it all."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.gpu_hours import compare
from gpuscope.simeval.report import evaluate
from gpuscope.simeval.runner import RunResult, run_scenario

HERE = Path(__file__).parent
FAULTY = sorted(HERE.glob("*.yaml"))

#: module family -> the scenarios at the top of tests/scenarios it runs (each about a minute of CPU
#: or more; test_scenario_suite checks that every scenario is in one family)
FAMILIES = {
    "hardware": ("hardware-hard", "hardware-risk-short", "hardware-soft-short", "overlap"),
    "serving": ("serving", "serving-steady-kv", "serving-small-faults", "quality"),
    "training": ("training-run", "training-long"),
    "stragglers": ("training-many-stragglers", "training-worsening-straggler", "training-warmup-throttle"),
    "pace": ("training-small-faults", "training-two-speeds"),
}


def family(name: str) -> list[object]:
    """The scenario paths of ``name``, as pytest parameters named by scenario."""
    return [pytest.param(HERE / f"{stem}.yaml", id=stem) for stem in FAMILIES[name]]


#: families whose batches take the wire format's round trip (encode, parse, validate) on the way in;
#: the others skip it (about a fifth of a run's CPU): every HTTP test and the families here keep
#: the wire path covered, and `sim-eval` always takes it
THROUGH_WIRE = frozenset({"hardware", "serving"})


def _wired(path: Path) -> bool:
    return any(path.stem in FAMILIES[name] for name in THROUGH_WIRE)


@cache
def run(path: Path) -> RunResult:
    """Each scenario is simulated once per session, however many tests read its alerts."""
    return run_scenario(load_scenario(path), wire=_wired(path))


def check_every_fault_detected_and_nothing_serious_unexplained(path: Path) -> None:
    result = run(path)
    scenario = result.scenario
    report = evaluate(scenario, result.told)
    missed = [(o.fault.kind, o.fault.at, o.fault.target) for o in report.outcomes if o.alert_id is None]
    assert not missed, missed
    assert not report.false_p1p2, [a.to_dict() for a in report.false_p1p2]
    assert report.precision >= 0.95, [a.to_dict() for a in report.unexplained]
    p95 = report.percentile(0.95)
    assert p95 is None or p95 <= 15.0, report.ttd_hard
    hours = compare(result.measured_gpu_hours, result.true_gpu_hours)  # vs the simulator's truth
    assert hours["max_error_pct"] <= 2.0, hours
