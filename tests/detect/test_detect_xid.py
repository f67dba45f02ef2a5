"""gpu_xid_fatal / gpu_xid_app: class by code, hold time, clearing after a reset."""

from __future__ import annotations

from detect.rig import Driver, FakeCluster
from gpuscope.detect.presence import GpuLostDetector
from gpuscope.detect.xid import XidDetector, parse_code
from gpuscope.model import Event


def test_fatal_xid_fires_at_once_and_clears_when_the_gpu_returns_after_a_reset() -> None:
    cluster = FakeCluster(nodes=2, gpus=4)
    driver = Driver([XidDetector(), GpuLostDetector()])
    driver.run(0, 30, cluster.batches)
    cluster.event(30.0, "xid", "node-1", "2", code=79, message="GPU has fallen off the bus.")
    driver.tick(30, cluster.batches(30))
    cluster.missing.add(("node-1", "2"))
    driver.run(31, 100, cluster.batches)

    xid = driver.only("gpu_xid_fatal")
    assert (xid.started_at, xid.entity, xid.severity, xid.owner) == (
        30,
        {"node": "node-1", "gpu": "2"},
        "P1",
        "platform",
    )
    assert "XID 79" in xid.summary and "fallen off the bus" in xid.summary
    assert xid.value == 79 and xid.firing
    assert driver.only("gpu_lost").started_at <= 33  # the same fault seen as a missing GPU

    cluster.missing.clear()  # the node was reset: the GPU answers again
    driver.run(100, 120, cluster.batches)
    assert xid.resolved_at is not None and 100 <= xid.resolved_at <= 106
    assert not driver.alerts.firing()
    assert driver.detection.stats()["xid_cleared_by_reset"] == 1


def test_application_xid_is_p3_and_holds_for_the_hold_time() -> None:
    cluster = FakeCluster(nodes=1, gpus=2)
    driver = Driver([XidDetector(hold=60.0)])
    driver.run(0, 10, cluster.batches)
    cluster.event(10.0, "xid", "node-0", "1", code=13)
    driver.run(10, 40, cluster.batches)
    cluster.event(40.0, "xid", "node-0", "1", code=43)  # a second app XID extends the hold
    driver.run(40, 50, cluster.batches)
    cluster.event(50.0, "xid", "node-0", "1", code=43)
    driver.run(50, 140, cluster.batches)

    alert = driver.only("gpu_xid_app")
    assert (alert.severity, alert.owner, alert.started_at) == ("P3", "model", 10)
    assert alert.details["codes"] == [13, 43] and alert.details["count"] == 3
    assert alert.resolved_at is not None and 110 <= alert.resolved_at <= 116
    # another code on the GPU is another cause: told again, once (a repeat only counts)
    assert [(w["at"], w["stage"], w["severity"]) for w in alert.details["worsened"]] == [(40, 1, "P3")]
    assert not driver.alerts_of("gpu_xid_fatal")


def test_unknown_and_malformed_codes_are_application_class_and_counted() -> None:
    cluster = FakeCluster(nodes=1, gpus=2)
    driver = Driver([XidDetector()])
    cluster.event(1.0, "xid", "node-0", "0", code=999)
    cluster.event(1.0, "xid", "node-0", "1", code="not-a-number")
    driver.run(1, 5, cluster.batches)
    rules = sorted((a.rule, a.entity["gpu"]) for a in driver.alerts.all())
    assert rules == [("gpu_xid_app", "0"), ("gpu_xid_app", "1")]
    assert driver.detection.stats()["xid_events_bad_code"] == 1
    assert next(a for a in driver.alerts.all() if a.entity["gpu"] == "1").value is None


def test_xid_without_gpu_labels_is_counted_not_raised() -> None:
    cluster = FakeCluster(nodes=1, gpus=1)
    driver = Driver([XidDetector()])
    batch = cluster.batch(1.0, "node-0")
    batch.events.append(Event(1.0, "xid", {"node": "node-0"}, {"code": 79}))
    driver.tick(1.0, [batch])
    assert not driver.alerts.all()
    assert driver.detection.stats()["xid_events_without_gpu"] == 1


def test_parse_code() -> None:
    assert [parse_code(x) for x in (79, "48", 13.0, " 31 ", True, None, 1.5, "x")] == [
        79,
        48,
        13,
        31,
        None,
        None,
        None,
        None,
    ]
