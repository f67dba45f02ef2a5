"""version_regression names a version only if it served: a promotion that never took traffic (a
version promoted by hand while the service kept running the old one) is not blamed."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.versions import VersionDetector
from gpuscope.model import Event, Frame

METRICS = ["inference_requests_per_second", "inference_errors_per_second", "inference_latency_p95_seconds"]


def run(served_version_after: str) -> list[str]:
    det = VersionDetector()
    rules: list[str] = []
    for t in range(0, 900):
        version = "v7" if t < 600 else served_version_after
        p95 = 0.2 if t < 620 else 0.6  # a latency burst 20 s after the promotion
        labels = {"service": "chat", "model": "chat", "version": version, "node": "node-3"}
        det.on_frame(Frame(float(t), METRICS, [labels], np.array([[40.0, 0.0, p95]])))
        if t == 600:
            promoted = {"service": "chat", "model": "chat", "version": "v8"}
            det.on_event(Event(600.0, "model_version_promoted", promoted))
        rules += [f"{f.rule}:{f.entity['version']}" for f in det.evaluate(float(t))]
    return rules


def test_a_version_that_never_served_is_not_blamed() -> None:
    assert run(served_version_after="v7") == []


def test_a_version_that_serves_when_latency_rises_is_blamed() -> None:
    assert "version_regression:v8" in run(served_version_after="v8")
