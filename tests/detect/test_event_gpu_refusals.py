"""Events that must name a GPU (xid, ecc_dbe, gpu_lost): one without its node or gpu label is counted
and logged under the detector's own kind, never taken for some GPU."""

from __future__ import annotations

import logging

import pytest

from gpuscope.counters import Counters
from gpuscope.detect.ecc import EccDetector
from gpuscope.detect.presence import GpuLostDetector
from gpuscope.detect.xid import XidDetector
from gpuscope.model import Event


@pytest.mark.parametrize(
    ("detector", "kind", "data", "counted"),
    [
        (XidDetector, "xid", {"code": 79}, "xid_events_without_gpu"),
        (EccDetector, "ecc_dbe", {"count": 1}, "ecc_events_without_gpu"),
        (GpuLostDetector, "gpu_lost", {"reason": "fell off the bus"}, "gpu_lost_events_without_gpu"),
    ],
)
def test_an_event_without_its_gpu_is_counted_under_the_detectors_kind(
    detector: type[XidDetector | EccDetector | GpuLostDetector],
    kind: str,
    data: dict[str, object],
    counted: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    judge = detector()
    counters: Counters = judge.counters
    with caplog.at_level(logging.WARNING, logger="gpuscope.detect"):
        judge.on_event(Event(5.0, kind, {"node": "n1"}, data))
        judge.on_event(Event(6.0, kind, {"gpu": "0"}, data))
    assert counters.snapshot() == {counted: 2}
    assert (
        f"{kind} event at 5.0 lacks labels node and gpu: {{'node': 'n1'}} [counted as {counted};"
        in caplog.text
    )
    judge.on_event(Event(7.0, kind, {"node": "n1", "gpu": "0"}, data))
    assert counters.get(counted) == 2
