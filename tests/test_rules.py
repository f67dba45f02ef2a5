"""One home per rule: every rule has a detector, a playbook, a scenario and a doc entry, and every
fact derived from the table (hard rules, fault → rule, layers) agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.alert.engine import check_pending
from gpuscope.alert.playbooks import PLAYBOOKS
from gpuscope.detect.base import DETECTORS, Detector, register
from gpuscope.detect.engine import DetectionEngine, load_detectors
from gpuscope.docgen import render_rules
from gpuscope.rules import (
    HUB_OVERLOADED,
    JOB_PENDING_TOO_LONG,
    LOSS_NAN,
    RULES,
    STEP_TIME_REGRESSION,
    TRAINING_STRAGGLER,
    rules_of,
    stages_of,
)
from gpuscope.sim.kinds import FAULT_KINDS, HARD_FAULTS, rule_for_fault
from gpuscope.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
#: rules the simulator cannot fault: the hub's own overload (tests/web/test_overload.py drives a real
#: hub past capacity) and the scheduler's queue (tests/collect/test_slurm*.py, a real Slurm)
NOT_SIMULATED = {HUB_OVERLOADED, JOB_PENDING_TOO_LONG}


def test_every_rule_has_a_playbook_and_every_playbook_a_rule() -> None:
    assert set(PLAYBOOKS) == set(RULES)


def test_every_rule_is_raised_by_a_registered_detector_and_no_detector_invents_one() -> None:
    load_detectors()
    raised = {rule for cls in DETECTORS.values() for rule in cls.rules}
    raised.add(HUB_OVERLOADED)  # the hub's own lag, judged where requests are admitted (ingest/overload)
    assert raised == set(RULES), (sorted(set(RULES) - raised), sorted(raised - set(RULES)))


def test_every_rule_is_the_expected_alert_of_a_fault_in_the_scenario_suite() -> None:
    expected = {rule_for_fault(f.kind, f.params) for path in SCENARIOS for f in load_scenario(path).faults}
    assert set(RULES) - NOT_SIMULATED <= expected, sorted(set(RULES) - NOT_SIMULATED - expected)


def test_docs_rule_reference_is_rendered_from_the_table() -> None:
    doc = (ROOT / "docs" / "rules.md").read_text()
    assert doc == render_rules(), "docs/rules.md is stale: python -m gpuscope.docgen"
    for name in RULES:
        assert f"## {name}\n" in doc


def test_fault_kinds_name_known_rules_and_hard_faults_follow_the_rules_hard_column() -> None:
    assert {kind.rule for kind in FAULT_KINDS.values()} <= set(RULES)
    assert {"xid", "ecc_dbe", "gpu_lost", "node_down", "rank_dropout"} == HARD_FAULTS
    for name, s in RULES.items():
        if s.hard:
            with pytest.raises(ValueError, match="hard fault"):
                check_pending({name: 5.0})
        else:
            assert check_pending({name: 5.0}) == {name: 5.0}


def test_layers_partition_the_rules() -> None:
    layers = [rules_of(name) for name in ("hardware", "training", "serving", "quality", "platform")]
    assert sum(len(layer) for layer in layers) == len(RULES)
    assert layers[4] == {"hub_overloaded", "job_pending_too_long"}
    assert {"gpu_xid_fatal", "nvlink_errors"} <= layers[0]
    assert {"prediction_drift", "confidence_shift", "input_drift", "business_metric_drop"} == layers[3]


def test_engine_feeds_every_table_detector_from_one_shared_table() -> None:
    engine = DetectionEngine()
    tabled = [d for d in engine.detectors if d.feed == "gpu_table"]
    stepped = [d for d in engine.detectors if d.feed == "steps"]
    served = [d for d in engine.detectors if d.feed == "services"]
    assert len(tabled) >= 4 and len(stepped) >= 3 and len(served) >= 2
    assert all(vars(d)["table"] is engine.feeds.table for d in tabled)
    assert all(vars(d)["steps"] is engine.feeds.steps for d in stepped)
    assert all(vars(d)["services"] is engine.feeds.services for d in served)
    assert set(engine.feeds.table.metrics) == {m for d in tabled for m in d.metrics}


def test_registering_two_detectors_under_one_name_is_refused() -> None:
    load_detectors()
    clash = type("XidDetector", (Detector,), {})
    with pytest.raises(ValueError, match="two detectors"):
        register(clash)


def test_a_rules_stage_bar_is_fixed_or_measured_against_its_own_noise() -> None:
    straggler, pace = stages_of(TRAINING_STRAGGLER), stages_of(STEP_TIME_REGRESSION)
    assert straggler.bar() == straggler.bar(0.5) == 1.25  # a quarter worse, whatever the noise
    assert pace.bar(0.0) == pace.bar() == pytest.approx(1.08)  # quiet: the material floor
    assert pace.bar(0.05) == pytest.approx(1.15)  # three times a 5 % wander
    assert straggler.hold == pace.hold == 30.0
    with pytest.raises(ValueError, match="loss_nan"):
        stages_of(LOSS_NAN)
