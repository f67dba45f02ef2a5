"""Goodput accounting: productive step time against each kind of badput, restarts across processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.sdk.goodput import Goodput


def test_productive_time_and_badput_by_cause(tmp_path: Path) -> None:
    g = Goodput(started_at=100.0, state_file=tmp_path / "g.json")
    g.first_step(130.0)
    for step in range(10):
        g.step(step, {"step_seconds": 2.0, "data_wait_seconds": 0.5})
    g.add("checkpoint", 6.0)
    g.add("restore", 4.0)
    report = g.report(now=200.0)
    assert report.productive_seconds == pytest.approx(15.0)
    assert report.badput_seconds == pytest.approx(
        {"init": 30.0, "checkpoint": 6.0, "restore": 4.0, "data_wait": 5.0, "restart": 0.0}
    )
    assert report.ratio == pytest.approx(15.0 / 100.0)
    assert report.metrics()["badput_init_seconds_total"] == 30.0
    with pytest.raises(ValueError, match="unknown badput kind"):
        g.add("coffee", 1.0)


def test_a_step_seen_again_is_progress_lost_to_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "rank-0" / "goodput.json"
    first = Goodput(started_at=0.0, state_file=state)
    for step in range(50):
        first.step(step, {"step_seconds": 1.0})
    first.save()
    # a new process of the same rank resumes from the checkpoint of step 40: steps 40..49 are redone
    second = Goodput(started_at=60.0, state_file=state)
    second.step(40, {"step_seconds": 1.0})
    assert second.report(70.0).badput_seconds["restart"] == pytest.approx(10.0)
    assert second.restarts == 1
    # and within one process, a rollback to an earlier step counts the same way
    second.step(41, {"step_seconds": 1.0})
    second.step(38, {"step_seconds": 1.0})
    assert second.report(80.0).badput_seconds["restart"] == pytest.approx(14.0)


def test_unreadable_state_is_not_fatal(tmp_path: Path) -> None:
    state = tmp_path / "goodput.json"
    state.write_text("{not json")
    g = Goodput(started_at=0.0, state_file=state)
    g.step(0, {"step_seconds": 1.0})
    assert g.report(1.0).badput_seconds["restart"] == 0.0
