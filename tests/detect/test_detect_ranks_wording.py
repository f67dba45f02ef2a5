"""What a straggler finding says: the reading an alert keeps once the rank has recovered, and how
far behind a straggler inside a slower speed group is."""

from __future__ import annotations

from detect.test_detect_ranks import rules, run


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
