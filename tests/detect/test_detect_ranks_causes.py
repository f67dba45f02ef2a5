"""A slowdown with a cause is no placement: a rank slowed by a hardware fault on its own GPU
while the job learns its speeds, a rank that slows down inside the warm-up, and a slow group that
catches up (a placement does not heal on its own)."""

from __future__ import annotations

import numpy as np

from detect.rank_traces import report_step
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.ranks import RankDetector
from gpuscope.model import Finding

WORLD = 8
HOT = Finding("gpu_thermal_throttle", {"node": "n1", "gpu": "1"}, "node n1 GPU 1 is throttled")


def run(
    slow: dict[int, list[tuple[int, int, float]]],
    hot: tuple[int, int] | None = None,
    steps: int = 400,
    seed: int = 11,
) -> list[list[Finding]]:
    """A synchronous job of 8 ranks on nodes n0 and n1 (rank r on GPU r % 4), each reporting how
    late it arrived at the collective; ``slow[r]`` lists (from, to, factor) slowdowns of rank r
    in steps, and while ``hot`` (from, to) steps the GPU of rank 5 (n1 GPU 1) has a live
    ``gpu_thermal_throttle`` finding."""
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(0.97, 1.03, WORLD)
    detector = RankDetector()
    out: list[list[Finding]] = []
    for k in range(steps):
        factor = np.ones(WORLD)
        for rank, spans in slow.items():
            for start, end, f in spans:
                if start <= k < end:
                    factor[rank] = f
        compute = 0.85 * offsets * factor * (1.0 - np.abs(0.012 * rng.standard_normal(WORLD)))
        report_step(detector, k, compute)
        # the engine hands every step rule the hardware findings of its last evaluation
        detector.faults.update([HOT] if hot is not None and hot[0] <= k < hot[1] else [])
        out.append(detector.evaluate(k + 0.6))
    return out


def of(findings: list[list[Finding]], rule: str) -> list[tuple[int, Finding]]:
    return [(k, f) for k, fs in enumerate(findings) for f in fs if f.rule == rule]


def test_a_rank_slowed_by_its_throttled_gpu_through_the_warm_up_is_held_not_placed() -> None:
    # rank 5's GPU is throttled (1.3x) from the first step to step 150, with its hardware alert live
    findings = run({5: [(0, 150, 1.3), (300, 400, 1.3)]}, hot=(0, 150))
    assert not of(findings, "slow_placement")
    stragglers = of(findings, "training_straggler")
    # held while the throttle explains it; learned once it cleared, so a later slowdown is flagged
    assert {int(f.entity["rank"]) for _, f in stragglers} == {5}
    assert 300 <= min(k for k, _ in stragglers) <= 320


def test_a_rank_that_slows_down_inside_the_warm_up_is_a_straggler_not_a_placement() -> None:
    findings = run({6: [(8, 400, 1.3)]})
    assert not of(findings, "slow_placement")
    stragglers = of(findings, "training_straggler")
    assert {int(f.entity["rank"]) for _, f in stragglers} == {6}
    assert min(k for k, _ in stragglers) <= 45
    assert all(
        any(f.entity["rank"] == "6" for f in fs if f.rule == "training_straggler") for fs in findings[60:]
    )


def test_a_slow_group_that_catches_up_is_no_longer_a_placement() -> None:
    findings = run({r: [(0, 200, 1.3)] for r in range(4, 8)})
    placed = of(findings, "slow_placement")
    assert placed and placed[-1][1].details["slow_ranks"] == [4, 5, 6, 7]
    assert min(k for k, _ in placed) <= 30
    assert 200 <= max(k for k, _ in placed) <= 215  # retracted once the group caught up
    assert not of(findings, "training_straggler")
    assert not of(findings[216:], "slow_placement")


def test_a_placement_present_from_the_start_without_a_hardware_cause_is_still_one() -> None:
    findings = run({r: [(0, 400, 1.3)] for r in range(4, 8)}, hot=(0, 400), seed=12)
    # the hardware alert is on rank 5's GPU alone: ranks 4, 6 and 7 are the placement
    placed = of(findings, "slow_placement")
    assert placed and placed[-1][1].details["slow_ranks"] == [4, 6, 7]
    assert not of(findings, "training_straggler")


def test_the_engine_hands_the_step_rules_the_hardware_findings_of_its_last_evaluation() -> None:
    engine = DetectionEngine()
    ranks = next(d for d in engine.detectors if type(d) is RankDetector)
    assert ranks.faults is engine.feeds.faults
    engine.evaluate(1.0)
    assert not engine.feeds.faults.on({"node": "n1", "gpu": "1"})
    engine.feeds.faults.update([HOT, Finding("network_degraded", {"node": "n2"}, "retransmits")])
    assert engine.feeds.faults.on({"node": "n1", "gpu": "1"})
    assert not engine.feeds.faults.on({"node": "n1", "gpu": "2"})
    assert engine.feeds.faults.on({"node": "n2", "gpu": "0"})  # a node-wide fault covers its GPUs
    engine.feeds.faults.update(
        [Finding("training_straggler", {"job": "j", "rank": "5", "node": "n1", "gpu": "1"}, "")]
    )
    assert not engine.feeds.faults.on({"node": "n1", "gpu": "1"})  # not a hardware rule
