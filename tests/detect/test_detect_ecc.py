"""gpu_ecc_uncorrectable: counter rises, events, row-remap failure; history is not news."""

from __future__ import annotations

import numpy as np

from detect.rig import Driver, FakeCluster
from gpuscope.detect.ecc import EccDetector
from gpuscope.model import Frame

GPU = ("node-0", "3")


def test_volatile_dbe_rise_fires_stays_while_nonzero_and_clears_after_reset() -> None:
    cluster = FakeCluster(nodes=1, gpus=4)
    driver = Driver([EccDetector(hold=60.0)])
    driver.run(0, 20, cluster.batches)
    cluster.overrides[GPU] = {"gpu_ecc_dbe_volatile_total": 1.0, "gpu_ecc_dbe_aggregate_total": 1.0}
    driver.run(20, 200, cluster.batches)  # far past the hold: the volatile count keeps it firing

    alert = driver.only("gpu_ecc_uncorrectable")
    assert (alert.started_at, alert.entity, alert.severity) == (20, {"node": "node-0", "gpu": "3"}, "P1")
    assert alert.firing and alert.value == 1.0
    assert "rose from 0 to 1" in alert.summary

    cluster.overrides[GPU] = {"gpu_ecc_dbe_aggregate_total": 1.0}  # reset: volatile back to 0
    driver.run(200, 220, cluster.batches)
    assert alert.resolved_at is not None and 200 <= alert.resolved_at <= 206
    assert driver.detection.stats()["ecc_reset_seen"] == 1


def test_event_fires_and_holds_for_the_hold_time() -> None:
    cluster = FakeCluster(nodes=1, gpus=4)
    driver = Driver([EccDetector(hold=30.0)])
    driver.run(0, 10, cluster.batches)
    cluster.event(10.0, "ecc_dbe", *GPU, count=2)
    driver.run(10, 60, cluster.batches)
    alert = driver.only("gpu_ecc_uncorrectable")
    assert alert.started_at == 10 and "2 uncorrectable" in alert.summary
    assert alert.resolved_at is not None and 40 <= alert.resolved_at <= 46


def test_history_at_first_sight_is_a_baseline_but_a_later_rise_fires() -> None:
    cluster = FakeCluster(nodes=1, gpus=4)
    cluster.overrides[GPU] = {"gpu_ecc_dbe_aggregate_total": 3.0, "gpu_remapped_rows_uncorrectable": 2.0}
    driver = Driver([EccDetector(hold=30.0)])
    driver.run(0, 50, cluster.batches)
    assert not driver.alerts.all()
    cluster.overrides[GPU] = {"gpu_ecc_dbe_aggregate_total": 3.0, "gpu_remapped_rows_uncorrectable": 3.0}
    driver.run(50, 60, cluster.batches)
    alert = driver.only("gpu_ecc_uncorrectable")
    assert alert.started_at == 50 and "remapped rows rose from 2 to 3" in alert.summary


def test_row_remap_failure_fires_while_set_and_volatile_at_first_sight_fires() -> None:
    cluster = FakeCluster(nodes=1, gpus=4)
    cluster.overrides[("node-0", "0")] = {"gpu_ecc_dbe_volatile_total": 4.0}
    driver = Driver([EccDetector(hold=30.0)])
    driver.run(0, 5, cluster.batches)
    cluster.overrides[GPU] = {"gpu_remapped_rows_failure": 1.0}
    driver.run(5, 100, cluster.batches)
    by_gpu = {a.entity["gpu"]: a for a in driver.alerts.all()}
    assert set(by_gpu) == {"0", "3"}
    assert by_gpu["0"].started_at == 0 and by_gpu["0"].firing
    assert by_gpu["3"].started_at == 5 and by_gpu["3"].firing and by_gpu["3"].details["remap_failed"]


def test_missing_counters_are_not_zero() -> None:
    """A GPU whose ECC counters go unreported (NaN) and come back unchanged raises nothing."""
    cluster = FakeCluster(nodes=1, gpus=2)
    cluster.overrides[GPU[0], "1"] = {"gpu_ecc_dbe_aggregate_total": 5.0}
    driver = Driver([EccDetector()])
    driver.run(0, 10, cluster.batches)
    cluster.overrides[GPU[0], "1"] = {"gpu_ecc_dbe_aggregate_total": float("nan")}
    driver.run(10, 20, cluster.batches)
    cluster.overrides[GPU[0], "1"] = {"gpu_ecc_dbe_aggregate_total": 5.0}
    driver.run(20, 30, cluster.batches)
    assert not driver.alerts.all()


def test_a_late_frame_from_before_a_reset_is_stale_not_a_new_rise() -> None:
    # in a cluster a part forwarded by a peer hub can arrive after a newer one sent straight
    detector = EccDetector(hold=600.0)
    entity = [{"node": "node-0", "gpu": "3"}]

    def frame(ts: float, dbe: float) -> Frame:
        return Frame(ts, ["gpu_ecc_dbe_volatile_total"], entity, np.array([[dbe]]))

    detector.on_frame(frame(1.0, 0.0))
    detector.on_frame(frame(2.0, 2.0))
    assert [f.rule for f in detector.evaluate(2.5)] == ["gpu_ecc_uncorrectable"]
    detector.on_frame(frame(4.0, 0.0))  # reset
    detector.on_frame(frame(3.0, 2.0))  # older than the reset, arriving after it
    assert detector.evaluate(5.0) == []
    assert detector.counters.get("ecc_stale_frames") == 1
