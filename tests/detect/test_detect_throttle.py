"""gpu_thermal_throttle: sustained or recurring thermal slowdown (idle or loaded), or far hotter than
peers under load; gpu_power_throttle on a lowered enforced power limit whatever the load."""

from __future__ import annotations

import random
from collections.abc import Callable

from detect.rig import Driver, FakeCluster
from gpuscope.detect.clocks import ClockDetector
from gpuscope.detect.throttle import ThermalThrottleDetector
from gpuscope.model import Batch

HOT = ("node-0", "6")
THROTTLED = {"gpu_throttle_hw_thermal": 1.0, "gpu_temp_celsius": 91.0, "gpu_sm_clock_mhz": 1200.0}


def busy_cluster() -> FakeCluster:
    cluster = FakeCluster(nodes=1, gpus=8)
    cluster.allocate("llm", [(g, "node-0", str(g)) for g in range(8)])
    return cluster


def test_sustained_throttle_fires_after_half_the_window_and_clears() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    cluster.overrides[HOT] = THROTTLED
    driver.run(100, 200, cluster.batches)
    alert = driver.only("gpu_thermal_throttle")
    assert alert.entity == {"node": "node-0", "gpu": "6"} and alert.severity == "P2"
    assert 129 <= alert.started_at <= 131
    assert "clocks held down by temperature (91 °C)" in alert.summary
    assert alert.cost_per_hour == 2.5 * 0.3
    del cluster.overrides[HOT]
    driver.run(200, 300, cluster.batches)
    assert alert.resolved_at is not None and 230 <= alert.resolved_at <= 250


def test_recurring_throttle_via_clock_event_reasons_fires() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])

    def ticks(t: float) -> list[Batch]:
        if t >= 20 and int(t) % 10 < 6:  # 6 s on, 4 s off
            cluster.overrides[HOT] = {"gpu_clock_event_reasons": float(0x40 | 0x4)}
        else:
            cluster.overrides.pop(HOT, None)
        return cluster.batches(t)

    driver.run(0, 120, ticks)
    alert = driver.only("gpu_thermal_throttle")
    assert 50 <= alert.started_at <= 80 and alert.firing  # recurring: no flapping while it recurs


def test_blips_raise_nothing() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])

    def ticks(t: float) -> list[Batch]:
        if int(t) % 30 in (0, 1):  # a 2 s blip every 30 s
            cluster.overrides[HOT] = THROTTLED
        else:
            cluster.overrides.pop(HOT, None)
        return cluster.batches(t)

    driver.run(0, 400, ticks)
    assert not driver.alerts.all()


def test_an_idle_gpu_held_down_by_heat_fires_as_a_cooling_fault() -> None:
    """An idle GPU 40-50 °C above where idle GPUs sit, with its thermal slowdown engaged, has lost
    its cooling: the next work placed on it runs throttled, so it is the rule's P2 as under load."""
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    cluster.overrides[HOT] = {**THROTTLED, "gpu_utilization_percent": 0.0, "gpu_sm_active_ratio": 0.0}
    driver.run(100, 200, cluster.batches)
    alert = driver.only("gpu_thermal_throttle")
    assert alert.entity == {"node": "node-0", "gpu": "6"} and alert.severity == "P2"
    assert 129 <= alert.started_at <= 131 and "while idle" in alert.summary and alert.details["idle"]


def test_far_hotter_than_peers_of_the_same_job_fires_but_different_jobs_may_differ() -> None:
    cluster = FakeCluster(nodes=1, gpus=8)
    cluster.allocate("train", [(g, "node-0", str(g)) for g in range(6)])
    cluster.allocate("serve", [(0, "node-0", "6"), (1, "node-0", "7")])
    for gpu in ("6", "7"):  # a lighter workload runs 25 °C cooler: not a fault
        cluster.overrides[("node-0", gpu)] = {"gpu_temp_celsius": 41.0, "gpu_utilization_percent": 30.0}
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    assert not driver.alerts.all()
    cluster.overrides[("node-0", "2")] = {"gpu_temp_celsius": 88.0}  # 22 °C above its peers, no flags
    driver.run(100, 200, cluster.batches)
    alert = driver.only("gpu_thermal_throttle")
    assert alert.entity == {"node": "node-0", "gpu": "2"} and alert.details["cause"] == "hot_vs_peers"
    assert "above its peers" in alert.summary and 129 <= alert.started_at <= 131


def test_missing_temperature_and_flags_are_ignored() -> None:
    cluster = busy_cluster()
    nan = float("nan")
    cluster.overrides[HOT] = {
        "gpu_temp_celsius": nan,
        "gpu_throttle_hw_thermal": nan,
        "gpu_clock_event_reasons": nan,
        "gpu_utilization_percent": nan,
    }
    cluster.blank.add(("node-0", "1"))
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    assert not driver.alerts.all()


def capped_node() -> FakeCluster:
    """A node whose GPUs 6 and 7 serve inference at a light load (30 %), drawing 250 W."""
    cluster = busy_cluster()
    light = {"gpu_utilization_percent": 30.0, "gpu_power_watts": 250.0}
    for gpu in ("6", "7"):
        cluster.overrides[("node-0", gpu)] = dict(light)
    return cluster


def test_a_lowered_power_limit_fires_even_where_the_draw_never_reaches_it() -> None:
    cluster = capped_node()
    driver = Driver([ClockDetector()])
    driver.run(0, 100, cluster.batches)
    cluster.overrides[HOT]["gpu_power_limit_watts"] = 385.0  # capped at 55 %: 250 W never reaches it
    driver.run(100, 200, cluster.batches)
    alert = driver.only("gpu_power_throttle")
    assert alert.entity == {"node": "node-0", "gpu": "6"} and alert.severity == "P2"
    assert 130 <= alert.started_at <= 150
    assert "lowered to 385 W, 55% of the 700 W its node's other GPUs enforce" in alert.summary
    assert alert.details["limit_lowered"] and alert.details["node_power_limit_watts"] == 700.0
    cluster.overrides[HOT]["gpu_power_limit_watts"] = 700.0
    driver.run(200, 400, cluster.batches)
    assert alert.resolved_at is not None and 260 <= alert.resolved_at <= 300


def test_a_power_limit_lowered_alike_on_a_whole_node_or_a_little_raises_nothing() -> None:
    cluster = capped_node()
    for g in range(8):  # a deliberate cap on every GPU of the node
        cluster.overrides.setdefault(("node-0", str(g)), {})["gpu_power_limit_watts"] = 500.0
    cluster.overrides[HOT]["gpu_power_limit_watts"] = 450.0  # one 10 % lower: within the bar
    driver = Driver([ClockDetector()])
    driver.run(0, 300, cluster.batches)
    assert driver.alerts_of("gpu_power_throttle") == []


def _throttled_at(cluster: FakeCluster, clock: Callable[[float], float]) -> Callable[[float], list[Batch]]:
    def ticks(t: float) -> list[Batch]:
        cluster.overrides[HOT] = {**THROTTLED, "gpu_sm_clock_mhz": clock(t)}
        return cluster.batches(t)

    return ticks


def test_a_throttle_that_deepens_is_told_again_once() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    rng = random.Random(7)
    # held down to ~1,400 MHz (its readings ±3 %), then from 300 s to ~900 MHz: a third lower
    driver.run(
        100, 600, _throttled_at(cluster, lambda t: (1400.0 if t < 300 else 900.0) * rng.uniform(0.97, 1.03))
    )
    alert = driver.only("gpu_thermal_throttle")
    assert alert.firing and 129 <= alert.started_at <= 131
    (worse,) = alert.details["worsened"]  # one escalation, not one per reading
    assert worse["stage"] == 1 and 330 <= worse["at"] <= 360  # the lower clock held for its bar's hold
    assert "fell materially 1 time(s)" in worse["summary"] and "to 9" in worse["summary"]


def test_noise_around_a_steady_throttle_never_escalates() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    rng = random.Random(11)
    # a thermal control loop: the clock swings ±15 % around 1,200 MHz for ten minutes
    driver.run(100, 700, _throttled_at(cluster, lambda t: 1200.0 * rng.uniform(0.85, 1.15)))
    alert = driver.only("gpu_thermal_throttle")
    assert alert.firing and "worsened" not in alert.details


def test_a_clock_dip_shorter_than_the_hold_is_no_stage() -> None:
    cluster = busy_cluster()
    driver = Driver([ThermalThrottleDetector()])
    driver.run(0, 100, cluster.batches)
    # 20 s at half the clock, then back: the dip passes before the bar's hold (30 s)
    driver.run(100, 500, _throttled_at(cluster, lambda t: 700.0 if 300 <= t < 320 else 1400.0))
    assert "worsened" not in driver.only("gpu_thermal_throttle").details
