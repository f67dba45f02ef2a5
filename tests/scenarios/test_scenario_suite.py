"""The scenario suite: every fault kind the simulator injects, in virtual time, through the hub.

Each scenario file lists its faults (the ground truth); the run must detect every one with its
rule on its target within its window, raise no P1/P2 alert that no fault explains, keep precision
at 0.95 or better and find hard faults within the time budget (p95 <= 15 s). Healthy scenarios
must raise nothing at P1/P2. In every run the productivity model's GPU-hours per state are within
2 % of all GPU-hours of the simulator's ground truth. The scenarios at the top of this folder run
in ``make test``, one module per family (``test_scenarios_<family>.py``, the check in
``suite.py``) so that the test workers share them out. The healthy scenarios of ``healthy/`` (the
one-hour one and the 24 simulated hours of ``healthy-6h-*.yaml``) and the long runs of ``long/``
take minutes each: the evaluation job (``make eval``: ``eval/eval_families.py``) runs them all. In
``make test`` every faulty scenario's hours of healthy background count against its precision and
its unexplained P1/P2 alerts, and ``tests/detect/test_detect_scenarios.py`` keeps a healthy
cluster quiet.
"""

from __future__ import annotations

from gpuscope.sim.kinds import FAULT_KINDS, rule_for_fault
from gpuscope.sim.scenario import load_scenario
from scenarios.suite import FAMILIES, FAULTY, HERE


def test_every_scenario_runs_in_one_family() -> None:
    stems = [stem for family in FAMILIES.values() for stem in family]
    assert sorted(stems) == sorted(p.stem for p in FAULTY)
    modules = [HERE / f"test_scenarios_{family}.py" for family in sorted(FAMILIES)]
    assert sorted(HERE.glob("test_scenarios_*.py")) == modules


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
