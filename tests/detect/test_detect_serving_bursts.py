"""Serving at its daily peak: bursts of the service's own demand that saturate it for a minute or
two are its normal operation (judged against its burst length and its time-of-day band), a
capacity loss at the same peak still fires, and a condition that comes and goes is not a flap."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.services import ServiceAggregator, Snapshot
from gpuscope.detect.serving import ServingDetector
from gpuscope.model import Finding
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import parse_scenario
from support import chat_snapshot, judge_chat, onsets, onsets_of

PEAK = """
name: peak-bursts
seed: 141
duration: 10800
interval: 5
cluster: {nodes: 1, gpus_per_node: 1, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: chat, kind: inference, nodes: [node-0], rps: 20, capacity_rps: 40, diurnal_amplitude: 0.6,
     peak_at: 7200, model: chat, version: v1}
"""
LOSS = """faults:
  - {at: 8400, kind: queue_buildup, target: {service: chat}, params: {overload: 1.3}, duration: 900}
"""


def serve(text: str) -> list[tuple[float, list[Finding]]]:
    """The simulator's service rows, merged as the hub merges them, judged every tick."""
    sim = Simulator(parse_scenario(text, name="peak-bursts.yaml"), t0=0.0)
    services, detector = ServiceAggregator(), ServingDetector()
    out: list[tuple[float, list[Finding]]] = []
    for tick in sim.ticks():
        for batch in tick.node_batches.values():
            for frame in batch.frames:
                services.on_frame(frame)
        out.append((tick.t, detector.judge(tick.t, services.snapshots())))
    return out


def test_bursts_at_the_daily_peak_of_a_service_at_80_percent_of_capacity_raise_nothing() -> None:
    # the service starts two hours before its peak: nothing learned of this hour, nor of its bursts
    assert onsets(serve(PEAK)) == []


def test_a_capacity_loss_at_the_peak_still_fires_quickly() -> None:
    fired = onsets(serve(PEAK + LOSS))
    assert fired and all(8400.0 <= ts <= 9300.0 for ts, _ in fired), fired
    queue = [ts for ts, rule in fired if rule == "inference_queue_buildup"]
    assert queue and queue[0] <= 8400.0 + 60.0


def test_a_condition_that_comes_and_goes_fires_at_most_three_times_an_hour() -> None:
    """Latency 1.6x for 40 s every 10 minutes at a steady load: one alert, then fewer as it recurs."""
    rng = np.random.default_rng(3)

    def snapshot(ts: float) -> Snapshot:
        return chat_snapshot(ts, rng, latency=1.6 if ts >= 1800.0 and ts % 600.0 < 40.0 else 1.0)

    latency = onsets_of(
        judge_chat((5.0 * k for k in range(int(3 * 3600 / 5))), snapshot), "inference_latency_regression"
    )
    assert latency and latency[0] <= 1800.0 + 60.0
    assert all(sum(1 for u in latency if t <= u < t + 3600.0) <= 3 for t in latency), latency
