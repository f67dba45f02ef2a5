"""A GPU slower than the other parts of its job from its start: one P3 ``slow_placement`` naming it
with its cost, never a live fault; a part within the ordinary part-to-part spread raises nothing, and
a live slowdown of the slow part later on is still a gpu_underperforming (P2)."""

from __future__ import annotations

import math

import numpy as np

from detect.rig import Driver
from detect.test_detect_gpu_pace import KEYS, NoisyClocks
from gpuscope.detect.clocks import ClockDetector


def placed_at(seed: int, gpu: int, factor: float) -> NoisyClocks:
    """The job's clocks with ``gpu`` a part ``factor`` slower than the middle of the others."""
    clocks = NoisyClocks(seed)
    others = np.delete(clocks.part, gpu)
    clocks.part[gpu] = float(np.median(others)) - math.log(factor)
    return clocks


def test_a_gpu_five_per_cent_slow_from_its_start_is_one_p3_slow_placement_with_its_cost() -> None:
    for seed in (1, 2, 3):
        clocks = placed_at(seed, 6, 1.05)
        driver = Driver([ClockDetector()])
        driver.run(0, 1500, clocks.batches)
        assert driver.serious() == [], f"seed {seed}: {[a.summary for a in driver.serious()]}"
        placed = driver.only("slow_placement")
        assert placed.entity == {"job": "llm", "node": KEYS[6][0], "gpu": KEYS[6][1]}, f"seed {seed}"
        assert placed.severity == "P3" and placed.firing
        assert placed.value is not None and 0.035 < placed.value < 0.065, f"seed {seed}: {placed.value}"
        clocks.cluster.free("llm")  # the job ends: the placement resolves with it
        driver.run(1500, 1560, clocks.batches)
        assert driver.only("slow_placement").resolved_at is not None


def test_a_gpu_one_per_cent_slow_is_the_parts_spread_and_raises_nothing() -> None:
    for seed in (1, 2, 3):
        clocks = placed_at(seed, 6, 1.01)
        driver = Driver([ClockDetector()])
        driver.run(0, 1500, clocks.batches)
        assert driver.alerts_of() == [], f"seed {seed}: {[a.summary for a in driver.alerts_of()]}"


def test_a_slow_placed_gpu_that_slows_down_further_is_a_live_fault_and_its_placement_stays_one() -> None:
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.05)
        driver = Driver([ClockDetector()])
        driver.run(0, 1200, clocks.batches)
        clocks.factor[6] = 1.05
        driver.run(1200, 1800, clocks.batches)
        slow = driver.only("gpu_underperforming")
        assert (slow.entity["node"], slow.entity["gpu"]) == KEYS[6] and slow.severity == "P2"
        assert slow.started_at - 1200 <= 180, f"seed {seed}: found after {slow.started_at - 1200:.0f} s"
        assert driver.only("slow_placement").firing


def test_a_gpu_that_slows_down_while_its_pace_is_learned_is_a_live_fault_not_a_placement() -> None:
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.0)
        driver = Driver([ClockDetector()])
        driver.run(0, 150, clocks.batches)
        clocks.factor[6] = 1.08  # after its first readings, before its pace is learned
        driver.run(150, 600, clocks.batches)
        slow = driver.only("gpu_underperforming")
        assert (slow.entity["node"], slow.entity["gpu"]) == KEYS[6] and slow.severity == "P2"
        assert driver.alerts_of("slow_placement") == [], f"seed {seed}"


def test_a_gpu_twelve_per_cent_slow_from_its_start_is_a_placement_too() -> None:
    """Seen: past the own pace's 10 % bound a part was left to gpu_underperforming, which judges it
    against that bound and fires only where the rest of the lag passes its drift; a part 1.11-1.12x
    slower from its start raised nothing at all, and its job ran 10 % slow unsaid."""
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.12)
        driver = Driver([ClockDetector()])
        driver.run(0, 1200, clocks.batches)
        placed = driver.only("slow_placement")
        assert placed.entity == {"job": "llm", "node": KEYS[6][0], "gpu": KEYS[6][1]}, f"seed {seed}"
        assert placed.value is not None and 0.09 < placed.value < 0.125, f"seed {seed}: {placed.value}"
        assert driver.serious() == [], f"seed {seed}: {[a.summary for a in driver.serious()]}"
