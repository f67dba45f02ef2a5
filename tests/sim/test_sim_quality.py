"""Model-quality reports of simulated services: the SDK's payloads, on its cadence, through the wire."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.ingest.payload import batch_to_json, parse_batch
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.sketch import NumericSketch
from gpuscope.sim.quality import BUSINESS_INTERVAL, SKETCH_INTERVAL, numeric_sketch
from sim.simtrace import run, small


def test_vectorised_sketch_equals_the_sdk_sketch() -> None:
    values = np.random.default_rng(3).lognormal(5.0, 1.2, 2000)
    ref = NumericSketch(alpha=0.01)
    ref.extend(values)
    mine, theirs = numeric_sketch(values).to_json(), ref.to_json()
    assert mine.pop("sum") == pytest.approx(theirs.pop("sum")) and mine == theirs
    with pytest.raises(ValueError, match="above 1e-12"):
        numeric_sketch(np.array([1.0, 0.0]))


def test_services_send_sketches_and_business_metrics_like_the_sdk() -> None:
    trace = run(small(duration=600))
    sketches = trace.events("quality_sketch", service="chat")
    assert {(e.labels["signal"], e.labels["feature"]) for e in sketches} == {
        ("prediction", "prediction"),
        ("confidence", "confidence"),
        ("input", "prompt_tokens"),
        ("input", "language"),
    }
    assert sorted({e.ts for e in sketches}) == [
        SKETCH_INTERVAL * k for k in range(1, 20)
    ]  # the service ends with the run at 600 s
    assert {e.labels["model"] for e in sketches} == {"chat"} and {e.labels["version"] for e in sketches} == {
        "v3"
    }
    frames = [(b, f) for b in trace.batches if b.source == "sdk:chat" for f in b.frames]
    assert [f.ts for _, f in frames] == [BUSINESS_INTERVAL * k for k in range(1, 10)]
    assert all(0.6 < f.values[0, 0] < 0.8 and f.entities[0]["metric"] == "accept_rate" for _, f in frames)
    # through the wire format, and the hub's monitor finds no drift in a healthy service
    monitor = QualityMonitor()
    scores = []
    for batch in trace.batches:
        derived = monitor.observe(parse_batch(batch_to_json(batch)))
        for f in derived.frames if derived else []:
            for name in (
                "model_prediction_drift_score",
                "model_confidence_drift_score",
                "model_input_drift_score",
            ):
                col = f.column(name)
                if col is not None:
                    scores.append(float(col[0]))
    assert len(scores) > 50 and max(scores) < 0.1
    assert monitor.counters.get("quality_refused_sketches") == 0


def test_an_idle_service_sketches_nothing_until_it_serves_again() -> None:
    trace = run(small("- {at: 100, kind: idle_allocation, target: {job: chat}, duration: 200}", duration=600))
    during = [e.ts for e in trace.events("quality_sketch", service="chat") if 130 < e.ts < 300]
    assert during == [] and trace.events("quality_sketch", service="chat")[-1].ts == 570
