"""nvlink_errors on the shapes of the 1,024-node load run: a GPU logging one CRC error every 30 s
is a real rate (the load generator replayed a healthy GPU's one error every ring turn, and the
detector was right to fire); one error, or one seen across a gap, is not news; a burst is."""

from __future__ import annotations

from collections.abc import Callable

from detect.rig import Driver, FakeCluster
from gpuscope.detect.rates import ErrorRateDetector
from gpuscope.model import Batch

CRC = "gpu_nvlink_crc_errors_total"
QUIET = ("gpu_nvlink_replay_errors_total", "gpu_nvlink_recovery_errors_total")  # summed with CRC
GPU = ("node-0", "1")


def fleet(crc_of: Callable[[float], float]) -> Callable[[float], list[Batch]]:
    """Two GPUs; GPU 1's CRC counter at time t is ``crc_of(t)``, GPU 0's stays at 0."""
    cluster = FakeCluster(nodes=1, gpus=2)
    cluster.metrics.extend([CRC, *QUIET])
    quiet = dict.fromkeys(QUIET, 0.0)

    def make(t: float) -> list[Batch]:
        cluster.overrides[("node-0", "0")] = {CRC: 0.0, **quiet}
        cluster.overrides[GPU] = {CRC: crc_of(t), **quiet}
        return cluster.batches(t)

    return make


def test_one_error_every_30_seconds_fires_as_the_load_run_did() -> None:
    driver = Driver([ErrorRateDetector()])
    make = fleet(lambda t: 100.0 + (t + 15) // 30)  # the ring replay's shape: one error per 30-s turn
    t = 0.0
    while not driver.alerts_of("nvlink_errors") and t < 300:
        driver.tick(t, make(t))
        t += 1.0
    alert = driver.only("nvlink_errors")
    assert alert.entity == {"node": "node-0", "gpu": "1"} and alert.severity == "P2"
    assert alert.started_at < 150  # four errors in two minutes: a real rate, found
    # the run's five alerts all read ~3.24 errors at a usual ~0.52/h on firing: this shape
    assert 3.0 <= alert.details["windowed_count"] < 3.5
    assert 0.4 < alert.details["baseline_per_hour"] < 0.7


def test_a_healthy_gpus_single_error_even_across_a_gap_does_not_fire() -> None:
    driver = Driver([ErrorRateDetector()])
    make = fleet(lambda t: 7.0 + (t >= 300))  # one error at 300 s
    driver.run(0, 280, make)
    driver.run(340, 900, make)  # 60 s of the node's batches never arrived: the error lies in the gap
    assert not driver.alerts_of("nvlink_errors")


def test_a_burst_fires_within_a_tick() -> None:
    driver = Driver([ErrorRateDetector()])
    driver.run(0, 900, fleet(lambda t: 7.0 + (0 if t < 600 else min(5.0, t - 599))))  # 5 errors at 600-604 s
    alert = driver.only("nvlink_errors")
    assert 602 <= alert.started_at <= 603  # the third error


def test_a_gpu_reporting_only_its_crc_counter_is_judged_on_it() -> None:
    """Sources that export the CRC counter alone (no replay or recovery count) still fire on a burst."""
    cluster = FakeCluster(nodes=1, gpus=2)
    cluster.metrics.append(CRC)

    def make(t: float) -> list[Batch]:
        cluster.overrides[("node-0", "0")] = {CRC: 0.0}
        cluster.overrides[GPU] = {CRC: 7.0 + (0 if t < 600 else min(5.0, t - 599))}
        return cluster.batches(t)

    driver = Driver([ErrorRateDetector()])
    driver.run(0, 900, make)
    alert = driver.only("nvlink_errors")
    assert alert.entity == {"node": "node-0", "gpu": "1"}
    assert 602 <= alert.started_at <= 603
