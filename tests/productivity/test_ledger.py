"""The ledger splits a GPU's interval at minute boundaries; one within a minute is one cell."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from gpuscope.productivity.ledger import GROUPINGS, HOUR, MINUTE, MINUTES_KEPT_S, Cells, Ledger, Slot

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


def _feed(
    ledger: Ledger, start: float, end: float, gpus: int, every: float = 10.0, fold: bool = True
) -> None:
    """``gpus`` GPUs reporting every ``every`` s, each in two causes a minute (a checkpoint, then
    training): two cells per GPU-minute, as a fleet whose jobs checkpoint often."""
    slots = [
        (
            Slot(f"n{g // 8}", str(g % 8), "job-a", "team-a", "", "checkpoint"),
            Slot(f"n{g // 8}", str(g % 8), "job-a", "team-a", "", "training"),
        )
        for g in range(gpus)
    ]
    t = start
    while t < end:
        for first, second in slots:
            ledger.add(t, t + every, first if t % MINUTE < 20.0 else second)
        t += every
        if fold:
            ledger.fold(t)
        if t % MINUTE == 0:
            ledger.unsaved()  # the hub saves once a minute


def _held(build: Callable[[], Ledger]) -> tuple[Ledger, int]:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ledger = build()
        return ledger, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_ledger_holds_the_same_bytes_after_six_hours_as_after_three_but_its_hour_buckets() -> None:
    gpus = 32

    def hours(n: int) -> Callable[[], Ledger]:
        def build() -> Ledger:
            ledger = Ledger()
            _feed(ledger, 0.0, n * HOUR, gpus)
            return ledger

        return build

    three, at_three = _held(hours(3))
    six, at_six = _held(hours(6))
    kept = sum(len(b) for b in six.minutes.values())
    assert len(six.minutes) <= MINUTES_KEPT_S / MINUTE + 1 and kept == 2 * gpus * len(six.minutes)
    # three more hour buckets (kept for the retention, a month, by design: a few cells a node and cause)
    hour_cells = sum(len(b) for b in six.hours.values()) - sum(len(b) for b in three.hours.values())
    assert hour_cells == 3 * 2 * (gpus // 8)
    # each hour past the first two adds its hour bucket (1-2 KiB here), nothing else
    assert at_six - at_three < 3 * 4096, (at_three, at_six)
    # two hours of minute cells, closed but for the last five minutes: 288 KiB here, where a dict
    # of two-float lists a minute took 1.25 MiB (about 160 bytes a cell)
    assert at_six < 40 * kept + 32 * 1024, (at_six, kept)


def test_a_closed_minute_counts_late_seconds_and_recounts_as_an_open_one() -> None:
    hung = Slot("n1", "1", "job-a", "team-a", "", "hung")
    checkpoint = Slot("n1", "1", "job-a", "team-a", "", "checkpoint")
    training = Slot("n1", "1", "job-a", "team-a", "", "training")
    closed, never = Ledger(), Ledger()
    _feed(closed, 0.0, 10 * MINUTE, 16)
    _feed(never, 0.0, 10 * MINUTE, 16, fold=False)
    closed.fold(30 * MINUTE)
    assert all(isinstance(b, Cells) for b in closed.minutes.values())
    assert not any(isinstance(b, Cells) for b in never.minutes.values())
    for ledger in (closed, never):
        # a stall learned late, over closed minutes; a late frame into one
        assert ledger.move(2 * MINUTE + 10.0, 4 * MINUTE + 50.0, checkpoint, hung) == 60.0
        assert ledger.move(2 * MINUTE + 10.0, 4 * MINUTE + 50.0, training, hung) == 120.0
        ledger.add(5 * MINUTE + 1.0, 5 * MINUTE + 3.0, hung, 0.5)
    for by in GROUPINGS:
        assert closed.summary(by, 0.0, 30 * MINUTE, 2.5) == never.summary(by, 0.0, 30 * MINUTE, 2.5)
    assert sorted(map(repr, closed.unsaved())) == sorted(map(repr, never.unsaved()))
