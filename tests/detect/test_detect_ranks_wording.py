"""What a straggler finding says: the reading an alert keeps once the rank has recovered, and how
far behind a straggler inside a slower speed group is."""

from __future__ import annotations

from detect.test_detect_ranks import TWO_SPEEDS, rules, run


def test_a_recovered_straggler_keeps_its_last_slow_reading() -> None:
    # the smoothed lag (median of 9) keeps a recovered rank flagged for a few steps after the
    # recent readings (median of 5) are back to normal: the alert's last refresh read "-0 % of a
    # step behind", and a resolved alert keeps its last summary
    for seed in (3, 4, 5):
        findings = run({3: [(150, 1.3), (250, 1.0)]}, steps=320, seed=seed)
        mine = [f for f in rules(findings, "training_straggler") if f.entity["rank"] == "3"]
        assert mine, seed
        worst = max(f.value or 0.0 for f in mine)
        assert worst >= 0.2, (seed, worst)
        last = mine[-1]
        assert last.value is not None and last.value >= 0.06, (seed, last.summary)
        assert "-0%" not in last.summary and " 0% " not in last.summary, last.summary


def test_stragglers_inside_the_slow_group_say_how_far_behind_their_group_they_were() -> None:
    # training-two-speeds: two ranks of the slow group slow down 4x, then recover; their alerts'
    # last summaries read "1 % of a step behind the ranks of its speed group 1" (the recovered
    # reading), against the 0.7 of a step they lagged while the alert fired
    findings = run(
        {5: [(150, 4.0), (250, 1.0)], 6: [(150, 4.0), (250, 1.0)]}, steps=320, placement=TWO_SPEEDS
    )
    for rank in ("5", "6"):
        mine = [f for f in rules(findings, "training_straggler") if f.entity["rank"] == rank]
        assert mine, rank
        last = mine[-1]
        assert last.value is not None and last.value >= 0.5, last.summary
        assert f"{last.value:.0%} of a step" in last.summary and "speed group 1" in last.summary
        assert last.details["step_seconds"] > 3.0, last.summary  # of the slow steps, not the recovered ones
        seconds = last.details["lag_seconds"] / last.details["step_seconds"]
        assert abs(seconds - last.value) < 1e-9, last.details
