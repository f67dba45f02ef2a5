"""gpu_lost and node_unreachable: absence judged fairly (jitter, hub pauses, new nodes)."""

from __future__ import annotations

from detect.rig import Driver, FakeCluster
from gpuscope.detect.presence import GpuLostDetector, NodeUnreachableDetector


def presence() -> Driver:
    return Driver([GpuLostDetector(), NodeUnreachableDetector()])


def test_gpu_absent_from_its_nodes_frames_is_lost_until_it_returns() -> None:
    cluster = FakeCluster(nodes=2, gpus=8)
    driver = presence()
    driver.run(0, 30, cluster.batches)
    cluster.missing.add(("node-0", "5"))
    driver.run(30, 60, cluster.batches)
    alert = driver.only("gpu_lost")
    assert alert.entity == {"node": "node-0", "gpu": "5"} and alert.severity == "P1"
    assert 30 <= alert.started_at <= 32  # last seen at 29: two missed reports
    assert alert.cost_per_hour == 2.5  # one GPU at 2.5/h, all of its work at risk
    cluster.missing.clear()
    driver.run(60, 70, cluster.batches)
    assert alert.resolved_at is not None and 60 <= alert.resolved_at <= 66
    assert not driver.alerts_of("node_unreachable")


def test_gpu_lost_event_fires_immediately_and_a_blank_row_counts_as_absent() -> None:
    cluster = FakeCluster(nodes=1, gpus=4)
    driver = presence()
    driver.run(0, 10, cluster.batches)
    cluster.event(10.0, "gpu_lost", "node-0", "1", reason="GPU_IS_LOST")
    cluster.blank.add(("node-0", "1"))  # NVML answers with nothing at all
    driver.run(10, 20, cluster.batches)
    alert = driver.only("gpu_lost")
    assert alert.started_at == 10 and "GPU_IS_LOST" in alert.summary
    cluster.blank.clear()
    driver.run(20, 30, cluster.batches)
    assert alert.resolved_at is not None


def test_node_down_fires_within_budget_and_resolves_when_it_reports_again() -> None:
    cluster = FakeCluster(nodes=4, gpus=8)
    driver = presence()
    driver.run(0, 50, cluster.batches)
    cluster.down.add("node-2")  # its last report was at t=49
    driver.run(50, 80, cluster.batches)
    alert = driver.only("node_unreachable")
    assert alert.entity == {"node": "node-2"} and alert.severity == "P1"
    assert 52 <= alert.started_at <= 54  # silence >= max(4 x 1 s, 4 s) since 49
    assert alert.cost_per_hour == 8 * 2.5  # all eight GPUs idle
    assert not driver.alerts_of("gpu_lost")  # a silent node says nothing about its GPUs
    cluster.down.clear()
    driver.run(80, 90, cluster.batches)
    assert alert.resolved_at is not None and 80 <= alert.resolved_at <= 86


def test_reporting_jitter_of_half_a_second_raises_nothing() -> None:
    cluster = FakeCluster(nodes=4, gpus=8, jitter=0.5, seed=3)
    driver = presence()
    driver.run(0, 600, cluster.batches)
    assert not driver.alerts.all()


def test_hub_pause_is_not_blamed_on_the_nodes() -> None:
    cluster = FakeCluster(nodes=4, gpus=2)
    driver = presence()
    driver.run(0, 30, cluster.batches)
    driver.run(30, 90, lambda t: [])  # the hub heard nothing for a minute but kept evaluating
    driver.run(90, 92, lambda t: cluster.batches(t)[:2])  # half the nodes are back first
    driver.run(92, 150, cluster.batches)
    assert not driver.alerts.all()
    assert driver.detection.stats()["node_verdicts_withheld_hub_gap"] > 0


def test_a_node_silent_during_a_hub_pause_is_reported_after_it() -> None:
    cluster = FakeCluster(nodes=4, gpus=2)
    driver = presence()
    driver.run(0, 30, cluster.batches)
    driver.run(30, 60, lambda t: [])
    cluster.down.add("node-3")
    driver.run(60, 80, cluster.batches)
    alert = driver.only("node_unreachable")
    assert alert.entity == {"node": "node-3"} and 63 <= alert.started_at <= 65


def test_node_that_reported_once_or_never_is_not_judged_and_slow_nodes_get_their_own_threshold() -> None:
    cluster = FakeCluster(nodes=3, gpus=1)
    driver = presence()
    driver.tick(0, cluster.batches(0))
    driver.run(
        1, 60, lambda t: [cluster.batch(t, "node-0")] + ([cluster.batch(t, "node-2")] if t % 10 == 0 else [])
    )
    assert not driver.alerts.all()  # node-1 reported once; node-2 reports every 10 s
    driver.run(60, 120, lambda t: [cluster.batch(t, "node-0")])
    alert = driver.only("node_unreachable")
    assert alert.entity == {"node": "node-2"}
    assert 90 <= alert.started_at <= 91  # 4 x its 10 s period after its last report at 50


def test_every_node_of_a_single_node_cluster_can_still_be_unreachable() -> None:
    cluster = FakeCluster(nodes=1, gpus=2)
    driver = presence()
    driver.run(0, 10, cluster.batches)
    driver.run(10, 20, lambda t: [])
    assert driver.only("node_unreachable").started_at == 13
