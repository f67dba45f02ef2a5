"""The fault-kind table is data (sim/kinds.yaml) read by one loader that refuses a bad row by name."""

from __future__ import annotations

import pytest

from gpuscope.rules import RULES
from gpuscope.sim.kinds import FAULT_KINDS, GPU_TARGET, RANK_TARGET, KindTableError, load_kinds


def test_the_table_loads_every_kind_with_its_rule_target_and_typed_defaults() -> None:
    assert FAULT_KINDS["xid"].rule == "gpu_xid_fatal" and FAULT_KINDS["xid"].target == GPU_TARGET
    assert FAULT_KINDS["loss_nan"].rule == "loss_nan"  # a kind named as its rule needs no rule field
    straggler = FAULT_KINDS["straggler_worsening"]
    assert straggler.target == RANK_TARGET and straggler.job_kind == "training"
    assert (
        straggler.params["worsen_after"].type is float and straggler.params["worsen_after"].default == 600.0
    )
    assert FAULT_KINDS["xid"].params["code"].type is int
    assert FAULT_KINDS["power_throttle"].params["mode"].choices == ("cap", "brake")
    assert FAULT_KINDS["gpu_failure_risk"].params["throttle"].type is bool
    assert all(kind.rule in RULES for kind in FAULT_KINDS.values())


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("xid: {rule: gpu_xid_deadly, target: gpu}", "xid.rule"),
        ("loss_nan: {target: cluster}", "loss_nan.target"),
        ("loss_nan: {target: job, job: batch}", "loss_nan.job"),
        ("xid: {rule: gpu_xid_fatal, target: gpu, colour: red}", "xid: a mapping"),
        ("xid: {rule: gpu_xid_fatal, target: gpu, params: {code: {lo: 1}}}", "xid.params.code"),
        ("xid: {rule: gpu_xid_fatal, target: gpu, params: {code: {default: 79, hi: lots}}}", "code.hi"),
        (
            "power_throttle: {target: gpu, rule: gpu_power_throttle,"
            " params: {mode: {default: x, choices: [cap]}}}",
            "mode.default",
        ),
        ("[]", "a mapping of fault kinds"),
    ],
)
def test_a_bad_row_is_refused_with_the_kind_and_field_named(text: str, named: str) -> None:
    with pytest.raises(KindTableError, match=named):
        load_kinds(text, "kinds.yaml")
