"""gpu_underperforming against each GPU's own pace: small slowdowns (1.03-1.05x) on parts whose
sustained clocks differ by a per cent or two are found, and two stable speeds of one model stay
quiet (clocks with part offsets, wander and reading noise, quantised to 15 MHz as NVML reports)."""

from __future__ import annotations

import math

import numpy as np

from detect.rig import Driver, FakeCluster
from gpuscope.detect.clocks import ClockDetector
from gpuscope.model import Batch

BASE = 1830.0
KEYS = [(f"node-{n}", str(g)) for n in range(2) for g in range(8)]


class NoisyClocks:
    """16 GPUs of one job: part offsets (1 % sigma), a job-wide wander, reading noise (``read``,
    0.5 % unless told)."""

    def __init__(self, seed: int, slower: dict[int, float] | None = None, read: float = 0.005) -> None:
        self.rng = np.random.default_rng(seed)
        self.read = read
        self.part = np.clip(self.rng.normal(0.0, 0.01, 16), -0.025, 0.025)
        for i, factor in (slower or {}).items():
            self.part[i] -= math.log(factor)
        self.common = 0.0
        self.factor = np.ones(16)
        self.paused = False  # a checkpoint: no kernels, so no GPU is under load
        self.cluster = FakeCluster(nodes=2, gpus=8)
        self.cluster.allocate("llm", [(i, node, gpu) for i, (node, gpu) in enumerate(KEYS)])

    def batches(self, t: float) -> list[Batch]:
        self.common = 0.99 * self.common + self.rng.normal(0.0, 0.002)
        noise = self.rng.normal(0.0, self.read, 16)
        mhz = BASE * np.exp(self.part + self.common + noise) / self.factor
        for i, key in enumerate(KEYS):
            self.cluster.overrides[key] = {"gpu_sm_clock_mhz": round(mhz[i] / 15.0) * 15.0}
            if self.paused:
                self.cluster.overrides[key]["gpu_utilization_percent"] = 3.0
        return self.cluster.batches(t)


def flagged_from(driver: Driver) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for a in driver.alerts_of("gpu_underperforming"):
        key = (a.entity["node"], a.entity["gpu"])
        out[key] = min(out.get(key, math.inf), a.started_at)
    return out


def test_a_five_percent_slowdown_among_parts_a_few_per_cent_apart_is_found_within_three_minutes() -> None:
    for seed in (1, 2, 3):
        clocks = NoisyClocks(seed)
        driver = Driver([ClockDetector()])
        driver.run(0, 900, clocks.batches)
        assert driver.alerts_of("gpu_underperforming") == [], f"seed {seed}: healthy parts flagged"
        clocks.factor[5] = 1.05
        driver.run(900, 1500, clocks.batches)
        found = flagged_from(driver)
        assert set(found) == {KEYS[5]}, f"seed {seed}: {found}"
        assert found[KEYS[5]] - 900 <= 180, f"seed {seed}: found after {found[KEYS[5]] - 900:.0f} s"


def test_a_three_percent_slowdown_is_found_and_is_one_alert() -> None:
    for seed in (1, 2):
        clocks = NoisyClocks(seed)
        driver = Driver([ClockDetector()])
        driver.run(0, 900, clocks.batches)
        clocks.factor[11] = 1.03
        driver.run(900, 1800, clocks.batches)
        alerts = driver.alerts_of("gpu_underperforming")
        assert [(a.entity["node"], a.entity["gpu"]) for a in alerts] == [KEYS[11]], f"seed {seed}"
        assert alerts[0].started_at - 900 <= 420, (
            f"seed {seed}: found after {alerts[0].started_at - 900:.0f} s"
        )
        assert alerts[0].value is not None and 0.95 < alerts[0].value < 0.99


def test_two_speeds_of_one_model_three_per_cent_apart_stay_quiet_and_a_slow_group_gpu_is_judged() -> None:
    for seed in (1, 2):
        clocks = NoisyClocks(seed, slower={i: 1.03 for i in range(8, 16)})
        driver = Driver([ClockDetector()])
        driver.run(0, 1500, clocks.batches)
        assert driver.serious() == [], f"seed {seed}: {[a.summary for a in driver.serious()]}"
        clocks.factor[13] = 1.05  # a GPU of the slower bin slows down further
        driver.run(1500, 1800, clocks.batches)
        assert set(flagged_from(driver)) == {KEYS[13]}, f"seed {seed}"


def test_a_slowdown_that_ends_resolves_and_the_gpu_keeps_its_pace() -> None:
    clocks = NoisyClocks(4)
    driver = Driver([ClockDetector()])
    driver.run(0, 900, clocks.batches)
    clocks.factor[2] = 1.05
    driver.run(900, 1500, clocks.batches)
    clocks.factor[2] = 1.0
    driver.run(1500, 1800, clocks.batches)
    (alert,) = driver.alerts_of("gpu_underperforming")
    assert (alert.entity["node"], alert.entity["gpu"]) == KEYS[2]
    assert alert.resolved_at is not None and alert.resolved_at - 1500 <= 240
    clocks.factor[2] = 1.05  # the same slowdown again: the pace did not learn it as normal
    driver.run(1800, 2100, clocks.batches)
    assert len(driver.alerts_of("gpu_underperforming")) == 2


def test_a_checkpoint_inside_a_small_slowdown_does_not_split_its_alert() -> None:
    clocks = NoisyClocks(5)
    driver = Driver([ClockDetector()])
    driver.run(0, 900, clocks.batches)
    clocks.factor[9] = 1.04
    driver.run(900, 1500, clocks.batches)
    clocks.paused = True  # a 45-s checkpoint while the GPU is flagged
    driver.run(1500, 1545, clocks.batches)
    clocks.paused = False
    driver.run(1545, 1700, clocks.batches)
    (alert,) = driver.alerts_of("gpu_underperforming")
    assert (alert.entity["node"], alert.entity["gpu"]) == KEYS[9]
    assert alert.firing
