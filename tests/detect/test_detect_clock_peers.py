"""gpu_underperforming against robust GPU peers: many slow GPUs at once, two speeds from the start,
GPUs joining the job (speed groups learned again, a live fault not learned as normal)."""

from __future__ import annotations

from detect.rig import Driver, FakeCluster
from gpuscope.detect.clocks import ClockDetector

FULL = 1980.0


def job_of(nodes: int, gpus: int = 8) -> tuple[FakeCluster, Driver, list[tuple[str, str]]]:
    cluster = FakeCluster(nodes=nodes, gpus=gpus)
    keys = [(f"node-{n}", str(g)) for n in range(nodes) for g in range(gpus)]
    cluster.allocate("llm", [(i, node, gpu) for i, (node, gpu) in enumerate(keys)])
    return cluster, Driver([ClockDetector()]), keys


def slow(cluster: FakeCluster, keys: list[tuple[str, str]], factor: float) -> None:
    for key in keys:
        cluster.overrides[key] = {"gpu_sm_clock_mhz": round(FULL / factor / 15.0) * 15.0}


def flagged(driver: Driver) -> set[tuple[str, str]]:
    return {(a.entity["node"], a.entity["gpu"]) for a in driver.alerts_of("gpu_underperforming") if a.firing}


def test_nine_of_sixteen_gpus_slowing_together_are_all_flagged_and_only_they() -> None:
    cluster, driver, keys = job_of(2)
    driver.run(0, 200, cluster.batches)
    slow(cluster, keys[:9], 1.1)
    driver.run(200, 320, cluster.batches)
    assert flagged(driver) == set(keys[:9])


def test_two_speeds_from_the_start_are_quiet_and_each_group_is_judged_on_its_own() -> None:
    cluster, driver, keys = job_of(2)
    slow(cluster, keys[8:], 1.25)  # the second node's parts run at lower clocks from the start
    driver.run(0, 400, cluster.batches)
    assert driver.alerts_of("gpu_underperforming") == []
    slow(cluster, [keys[3]], 1.1)  # a fast-group GPU slows down to 1.1x
    slow(cluster, [keys[12]], 1.25 * 1.1)  # a slow-group GPU slows down further
    driver.run(400, 520, cluster.batches)
    assert flagged(driver) == {keys[3], keys[12]}


def test_gpus_joining_the_job_are_learned_again_but_a_live_fault_is_not_the_new_normal() -> None:
    cluster, driver, keys = job_of(2)
    first, later = keys[:8], keys[8:]
    for key in later:
        del cluster.jobs[key]  # not yet part of the job
    driver.run(0, 200, cluster.batches)
    slow(cluster, first[:2], 1.15)  # two GPUs of the job go slow: a live fault
    driver.run(200, 300, cluster.batches)
    assert flagged(driver) == set(first[:2])
    cluster.allocate("llm", [(8 + i, node, gpu) for i, (node, gpu) in enumerate(later)])
    slow(cluster, later, 1.25)  # the job grows onto slower parts: their own speed group
    driver.run(300, 600, cluster.batches)
    assert flagged(driver) == set(first[:2])


def service_of_two() -> tuple[FakeCluster, Driver]:
    """A node: a training job on GPUs 0-5, a service on GPUs 6 and 7 at a light load (30 %)."""
    cluster = FakeCluster(nodes=1, gpus=8)
    cluster.allocate("llm", [(g, "node-0", str(g)) for g in range(6)])
    cluster.allocate("api", [(0, "node-0", "6"), (1, "node-0", "7")])
    for gpu in ("6", "7"):
        cluster.overrides[("node-0", gpu)] = {"gpu_utilization_percent": 30.0}
    return cluster, Driver([ClockDetector()])


def test_a_slow_gpu_with_too_few_peers_is_judged_against_the_clock_its_part_runs_at() -> None:
    cluster, driver = service_of_two()
    driver.run(0, 200, cluster.batches)
    assert driver.alerts_of("gpu_underperforming") == []
    slow_key = ("node-0", "6")
    cluster.overrides[slow_key]["gpu_sm_clock_mhz"] = 1305.0  # 1.52x slower, no clock event reason
    driver.run(200, 300, cluster.batches)
    alert = driver.only("gpu_underperforming")
    assert alert.entity == {"node": "node-0", "gpu": "6"} and alert.severity == "P2"
    assert 240 <= alert.started_at <= 270
    assert "1305 MHz under load with no clock event reason, 34% below the 1980 MHz" in alert.summary
    del cluster.overrides[slow_key]["gpu_sm_clock_mhz"]
    driver.run(300, 500, cluster.batches)
    assert alert.resolved_at is not None


def test_a_lone_gpu_slow_for_a_reason_or_idle_is_no_underperformer() -> None:
    cluster, driver = service_of_two()
    cluster.overrides[("node-0", "6")].update(
        {"gpu_sm_clock_mhz": 1305.0, "gpu_clock_event_reasons": 0x4, "gpu_throttle_sw_power": 1.0}
    )
    cluster.overrides[("node-0", "7")].update({"gpu_sm_clock_mhz": 345.0, "gpu_utilization_percent": 0.0})
    driver.run(0, 300, cluster.batches)
    assert driver.alerts_of("gpu_underperforming") == []
