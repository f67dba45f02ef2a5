"""The scenario suite (see test_scenario_suite.py), family hardware:
hard and soft hardware faults, a rising failure risk, and faults that overlap in time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.suite import check_every_fault_detected_and_nothing_serious_unexplained, family

pytestmark = pytest.mark.long


@pytest.mark.parametrize("path", family("hardware"))
def test_every_fault_is_detected_and_nothing_serious_is_unexplained(path: Path) -> None:
    check_every_fault_detected_and_nothing_serious_unexplained(path)
