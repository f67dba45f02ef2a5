"""gpu_failure_risk: its peer-lag evidence against robust GPU peers (the reference
gpu_underperforming uses): many GPUs slowing together do not hide a wearing GPU's lag, and a slower
group a job was placed on from the start is not lag that, with one other kind of evidence, invents
a risk. Overheating episodes are wear; power-cap episodes under load are not."""

from __future__ import annotations

from collections.abc import Callable

from detect.rig import Driver, FakeCluster
from gpuscope.detect.risk import FailureRiskDetector
from gpuscope.model import Batch

FULL = 1980.0
SBE = "gpu_ecc_sbe_aggregate_total"
STEP = 10.0  # seconds between evaluations: lag evidence is a share of an hour


def job_of_eight() -> tuple[FakeCluster, Driver, list[tuple[str, str]]]:
    cluster = FakeCluster(nodes=1, gpus=8)
    keys = [("node-0", str(g)) for g in range(8)]
    cluster.allocate("llm", [(i, node, gpu) for i, (node, gpu) in enumerate(keys)])
    return cluster, Driver([FailureRiskDetector()], resolve_after=3 * STEP), keys


def slow(cluster: FakeCluster, keys: list[tuple[str, str]], factor: float) -> None:
    for key in keys:
        cluster.overrides.setdefault(key, {})["gpu_sm_clock_mhz"] = round(FULL / factor / 15.0) * 15.0


def at_risk(driver: Driver) -> set[tuple[str, str]]:
    return {(a.entity["node"], a.entity["gpu"]) for a in driver.alerts_of("gpu_failure_risk")}


def test_five_of_eight_gpus_slowing_together_do_not_hide_the_lag_of_a_wearing_one() -> None:
    cluster, driver, keys = job_of_eight()
    driver.run(0, 700, cluster.batches, STEP)  # the job's speeds are learned: one group
    slow(cluster, keys[3:], 1.1)  # five of eight slow down; a median moves to them
    cluster.overrides[keys[7]][SBE] = 2.0 + 160.0  # and GPU 7 logs corrected errors (0.8 of ecc_full)
    driver.run(700, 3600, cluster.batches, STEP)
    assert at_risk(driver) == {keys[7]}  # lag + ECC; the other four slow GPUs have one kind only


def test_a_slower_group_placed_from_the_start_is_not_lag_that_invents_a_risk() -> None:
    cluster, driver, keys = job_of_eight()
    slow(cluster, keys[4:], 1.25)  # half the job on slower parts from the start
    cluster.overrides[keys[5]][SBE] = 2.0
    driver.run(0, 300, cluster.batches, STEP)
    cluster.overrides[keys[5]][SBE] = 2.0 + 160.0  # one kind of evidence: corrected errors
    driver.run(300, 3600, cluster.batches, STEP)
    assert at_risk(driver) == set()


def _episodes(
    cluster: FakeCluster, key: tuple[str, str], flag: str, every: float, length: float
) -> Callable[[float], list[Batch]]:
    """Batches with ``flag`` up for ``length`` seconds of every ``every``."""

    def make(t: float) -> list[Batch]:
        cluster.overrides[key][flag] = 1.0 if t % every < length else 0.0
        return cluster.batches(t)

    return make


def test_power_cap_episodes_under_load_are_not_wear() -> None:
    cluster, driver, keys = job_of_eight()
    cluster.overrides[keys[2]] = {SBE: 2.0}
    driver.run(0, 300, cluster.batches, STEP)
    cluster.overrides[keys[2]][SBE] = 2.0 + 120.0  # some corrected errors: one kind
    driver.run(300, 2400, _episodes(cluster, keys[2], "gpu_throttle_sw_power", 60.0, 20.0), STEP)
    assert at_risk(driver) == set()


def test_overheating_again_and_again_with_corrected_errors_is_a_risk() -> None:
    cluster, driver, keys = job_of_eight()
    cluster.overrides[keys[2]] = {SBE: 2.0}
    driver.run(0, 300, cluster.batches, STEP)
    cluster.overrides[keys[2]][SBE] = 2.0 + 120.0
    driver.run(300, 1800, _episodes(cluster, keys[2], "gpu_throttle_sw_thermal", 300.0, 90.0), STEP)
    assert at_risk(driver) == {keys[2]}  # five episodes of heat and the errors
