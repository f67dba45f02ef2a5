"""``sim-eval --report`` says why a fault was missed when the detectors' own learning explains it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpuscope.cli import main
from gpuscope.detect.business import BusinessDetector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.serving import ServingDetector
from gpuscope.rules import (
    BUSINESS_METRIC_DROP,
    INFERENCE_ERROR_RATE,
    INFERENCE_LATENCY_REGRESSION,
    INFERENCE_QUEUE_BUILDUP,
    INFERENCE_TTFT_REGRESSION,
    KV_CACHE_PRESSURE,
)
from gpuscope.sim.scenario import parse_scenario
from gpuscope.simeval.report import evaluate

SCENARIO = """
name: missed-while-learning
seed: 3
duration: 420
interval: 1
cluster: {nodes: 2, gpus_per_node: 2, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: chat, kind: inference, nodes: [node-0], start: 30}
  - {name: code, kind: inference, nodes: [node-1]}
faults:
  - {at: 40, kind: latency_spike, target: {service: chat}, duration: 30}
  - {at: 200, kind: business_drop, target: {service: chat}, params: {factor: 0.5}}
  - {at: 300, kind: latency_spike, target: {service: code}, duration: 90}
"""


def test_the_learning_windows_are_the_detectors_own() -> None:
    engine = DetectionEngine([ServingDetector(warmup=120.0), BusinessDetector(warmup=900.0)])
    learning = engine.learns_first()
    serving = (
        INFERENCE_LATENCY_REGRESSION,
        INFERENCE_TTFT_REGRESSION,
        INFERENCE_QUEUE_BUILDUP,
        KV_CACHE_PRESSURE,
    )
    assert learning == {**dict.fromkeys(serving, 120.0), BUSINESS_METRIC_DROP: 900.0}
    assert INFERENCE_ERROR_RATE not in learning  # the error budget burns from the first report


def test_a_missed_fault_names_the_learning_window_it_fell_in() -> None:
    scenario = parse_scenario(SCENARIO, name="s.yaml")
    report = evaluate(scenario, [], {INFERENCE_LATENCY_REGRESSION: 60.0, BUSINESS_METRIC_DROP: 600.0})
    short, drop, late = (o.missed_because for o in report.outcomes)
    # the service starts at 30 s: its latency is judged from 90 s, its business metric from 630 s
    assert short == "ended before any rule could judge it: service chat's first 60 s only learn its baseline"
    assert drop == "ended before any rule could judge it: service chat's first 600 s only learn its baseline"
    assert late is None  # after the learning: a miss there would have another cause, none is made up
    shorter = evaluate(scenario, [], {INFERENCE_LATENCY_REGRESSION: 20.0}).outcomes[0]
    assert (
        shorter.missed_because == "began while service chat's first 20 s only learn its baseline (until 50 s)"
    )
    assert evaluate(scenario, []).outcomes[0].missed_because is None  # no learning told, no reason


def test_sim_eval_prints_the_reason_beside_missed_and_adds_it_to_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    assert main(["sim-eval", str(path), "--report", "--json"]) == 0
    captured = capsys.readouterr()
    faults = orjson.loads(captured.out)["report"]["faults"]
    assert [f["detected"] for f in faults] == [False, False, True]
    assert "first 60 s only learn" in faults[0]["missed_because"]
    assert "first 600 s only learn" in faults[1]["missed_because"]
    assert "missed_because" not in faults[2]  # detected: the field is left out
    assert "MISSED (ended before any rule could judge it" in captured.err.replace("\n", " ")
