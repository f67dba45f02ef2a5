"""A GPU slower than the other parts of its job from its start: one P3 ``slow_placement`` naming it
with its cost, never a live fault; a part within the ordinary part-to-part spread raises nothing, and
a live slowdown of the slow part later on is still a gpu_underperforming (P2)."""

from __future__ import annotations

import math

import numpy as np
from pytest import approx

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


def test_a_gpu_twelve_or_fifteen_per_cent_slow_from_its_start_is_one_p2_and_no_placement() -> None:
    """Past the own pace's 10 % bound a part slow from its start is a faulty part: one P2
    gpu_underperforming by when its pace is learned, costed as the job's loss, and no P3 placement
    beside it. Seen before: 1.12x was a P3 placement only; 1.15x a P3 placement and, after about
    560 s, a P2 as well (one cause, two alerts of two tiers)."""
    for seed in (1, 2):
        for factor in (1.12, 1.15):
            clocks = placed_at(seed, 6, factor)
            driver = Driver([ClockDetector()])
            driver.run(0, 1200, clocks.batches)
            case = f"seed {seed}, {factor}x"
            assert driver.alerts_of("slow_placement") == [], case
            slow = driver.only("gpu_underperforming")  # one alert through the later evidence too
            assert (slow.entity["node"], slow.entity["gpu"]) == KEYS[6] and slow.severity == "P2", case
            assert slow.firing and slow.started_at <= 360, f"{case}: at {slow.started_at:.0f} s"
            assert slow.details["since_start"] is True, case
            lag = 1.0 - 1.0 / factor
            assert abs(slow.details["lag_share"] - lag) < 0.02, f"{case}: {slow.details['lag_share']}"
            # a synchronous job waits for it: the lag of each of its 16 GPUs, as for a placement
            price = driver.alerts.price_per_gpu_hour
            assert slow.cost_per_hour == approx(16 * price * slow.details["lag_share"]), case
            assert "since it started" in slow.summary and "faulty part" in slow.summary, slow.summary
            assert [a.rule for a in driver.serious()] == ["gpu_underperforming"], case


def test_a_slower_bin_evaluated_every_ten_seconds_is_no_p2_while_its_pace_is_learned() -> None:
    """Seen in the simulator at one evaluation every 10 s: a part 1.08x slower from its start was a
    P2 gpu_underperforming for five minutes before its P3 placement. Its pace's first 30 readings
    take 300 s at that cadence, and against the peers alone the fast path fired in about 110 s."""
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.06)
        driver = Driver([ClockDetector()])
        driver.run(0, 3800, clocks.batches, step=10.0)
        assert driver.serious() == [], f"seed {seed}: {[a.summary for a in driver.serious()]}"
        placed = driver.only("slow_placement")
        assert placed.entity == {"job": "llm", "node": KEYS[6][0], "gpu": KEYS[6][1]}, f"seed {seed}"


def test_a_part_fifteen_per_cent_slow_evaluated_every_ten_seconds_is_one_p2_for_the_run() -> None:
    """Seen at one evaluation every 10 s: a part 1.15x slower from its start was a P2 from 710 s to
    1040 s (the fast path against its pace held at the 10 % bound, at that path's bar) and a second
    P2 from 3740 s, when its pace was learned: two alerts in two incidents for one part."""
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.15)
        driver = Driver([ClockDetector()])
        driver.run(0, 4500, clocks.batches, step=10.0)
        case = f"seed {seed}"
        slow = driver.only("gpu_underperforming")
        assert (slow.entity["node"], slow.entity["gpu"]) == KEYS[6] and slow.firing, case
        assert slow.details["since_start"] is True, case
        assert [a.rule for a in driver.serious()] == ["gpu_underperforming"], case
        assert driver.alerts_of("slow_placement") == [], case


def test_a_healthy_group_evaluated_every_ten_seconds_raises_nothing() -> None:
    for seed in (1, 2):
        clocks = NoisyClocks(seed)
        driver = Driver([ClockDetector()])
        driver.run(0, 4500, clocks.batches, step=10.0)
        assert driver.alerts_of() == [], f"seed {seed}: {[a.summary for a in driver.alerts_of()]}"


def test_a_part_twenty_per_cent_slow_from_its_start_is_costed_at_its_whole_lag() -> None:
    """The pace is learned from readings clipped at 15 % around the group's reference, so a 1.2x
    part read 13.0-13.9 % and its cost was understated by a fifth; its lag is 1 - 1/1.2 = 16.7 %."""
    for seed in (1, 2):
        clocks = placed_at(seed, 6, 1.2)
        driver = Driver([ClockDetector()])
        driver.run(0, 600, clocks.batches)
        slow = driver.only("gpu_underperforming")
        lag = slow.details["lag_share"]
        assert abs(lag - (1.0 - 1.0 / 1.2)) < 0.01, f"seed {seed}: {lag}"
        assert slow.cost_per_hour == approx(16 * driver.alerts.price_per_gpu_hour * lag), f"seed {seed}"
        assert f"{lag:.1%} slower" in slow.summary, slow.summary


def test_a_healthy_group_whose_readings_are_ten_per_cent_apart_raises_nothing_in_two_hours() -> None:
    """Readings 10 % apart (one sigma each: a throughput proxy, or clocks read through a noisy
    exporter), evaluated every 10 s for 2 hours. Seen before: 43-44 P2 gpu_underperforming per seed
    on healthy GPUs; a third of the readings sat past the fast path's fixed 4 % bar, the evidence's
    bar was scaled by a wander learned from 0.5 % over an hour, and paces learned from readings cut
    at 15 % around the group's reference read a point fast, so healthy readings looked short."""
    for seed in (1, 2, 3):
        clocks = NoisyClocks(seed, read=0.10)
        driver = Driver([ClockDetector()])
        driver.run(0, 7200, clocks.batches, step=10.0)
        assert driver.alerts_of() == [], f"seed {seed}: {[a.summary for a in driver.alerts_of()]}"


def test_a_gpu_that_slows_down_twenty_per_cent_among_readings_ten_per_cent_apart_is_still_found() -> None:
    """The bars that keep a healthy group with readings 10 % apart quiet (two sigmas of one reading
    for the fast path, 20 % there) still find a live 1.2x slowdown, by the evidence, in minutes."""
    for seed in (1, 2):
        clocks = NoisyClocks(seed, read=0.10)
        driver = Driver([ClockDetector()])
        driver.run(0, 4500, clocks.batches, step=10.0)
        clocks.factor[5] = 1.2
        driver.run(4500, 5400, clocks.batches, step=10.0)
        slow = driver.only("gpu_underperforming")
        assert (slow.entity["node"], slow.entity["gpu"]) == KEYS[5] and slow.severity == "P2", f"seed {seed}"
        assert slow.started_at - 4500 <= 300, f"seed {seed}: found after {slow.started_at - 4500:.0f} s"
        assert "since_start" not in slow.details, f"seed {seed}"
