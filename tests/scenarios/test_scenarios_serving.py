"""The scenario suite (see test_scenario_suite.py), family serving:
serving faults, KV-cache pressure under steady load, and model-quality faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.suite import HERE, check_every_fault_detected_and_nothing_serious_unexplained, family, run

pytestmark = pytest.mark.long


@pytest.mark.parametrize("path", family("serving"))
def test_every_fault_is_detected_and_nothing_serious_is_unexplained(path: Path) -> None:
    check_every_fault_detected_and_nothing_serious_unexplained(path)


def test_steady_high_load_is_quiet_and_pressure_that_slows_requests_is_p2() -> None:
    result = run(HERE / "serving-steady-kv.yaml")
    busy = [a.to_dict() for a in result.alerts if a.entity.get("service") in ("busy-a", "busy-b")]
    assert not busy
    kv = [a for a in result.alerts if a.rule == "kv_cache_pressure"]
    assert [(a.entity, a.severity) for a in kv] == [({"service": "quiet"}, "P2")]
