"""The ledger splits a GPU's interval at minute boundaries; one within a minute is one cell."""

from __future__ import annotations

import pytest

from gpuscope.productivity.ledger import MINUTE, Ledger, Slot

SLOT = Slot("n1", "0", "job-a", "team-a", "", "slow_steps")


def test_an_interval_within_a_minute_and_one_across_minutes_are_counted_in_their_cells() -> None:
    ledger = Ledger()
    ledger.add(10 * MINUTE + 5.0, 10 * MINUTE + 6.0, SLOT, 0.25)
    ledger.add(10 * MINUTE + 59.5, 11 * MINUTE + 0.5, SLOT, 0.5)
    ledger.add(11 * MINUTE + 0.5, 11 * MINUTE + 60.0, SLOT)  # ends on the boundary: still one cell
    assert ledger.minutes[10][SLOT] == pytest.approx([1.5, 0.25 + 0.25])
    assert ledger.minutes[11][SLOT] == pytest.approx([60.0, 0.25])
    assert 12 not in ledger.minutes
    assert ledger.latest == 12 * MINUTE
    cells = sorted((c.bucket, c.seconds) for c in ledger.unsaved())
    assert cells == [(600.0, pytest.approx(1.5)), (660.0, pytest.approx(60.0))]


def test_an_empty_or_backward_interval_counts_nothing() -> None:
    ledger = Ledger()
    ledger.add(100.0, 100.0, SLOT)
    ledger.add(100.0, 90.0, SLOT)
    assert not ledger.minutes and not ledger.unsaved()
    assert ledger.latest == 100.0
