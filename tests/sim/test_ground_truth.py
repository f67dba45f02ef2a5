"""The simulator's ground truth of GPU time, and the hub's productivity model measured against it."""

from __future__ import annotations

from pathlib import Path

from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.gpu_hours import compare
from gpuscope.simeval.runner import run_scenario

SCENARIO = """
name: truth-small
seed: 5
duration: 420
interval: 1
cluster: {nodes: 2, gpus_per_node: 4, gpu_model: H100-SXM5-80GB, price_per_gpu_hour: 2.5}
jobs:
  - {name: train, kind: training, nodes: [node-0], step_time: 1.0, checkpoint_every: 120}
faults:
  - {at: 200, kind: training_hang, target: {job: train}, duration: 60}
  - {at: 300, kind: gpu_lost, target: {node: node-1, gpu: 2}}
"""


def test_truth_knows_each_gpu_second_and_the_hub_measures_it_within_two_percent(tmp_path: Path) -> None:
    path = tmp_path / "truth.yaml"
    path.write_text(SCENARIO)
    result = run_scenario(load_scenario(path))
    true = result.true_gpu_hours
    assert abs(sum(true.values()) - 8 * 420 / 3600) < 1e-9  # every GPU-second has exactly one state
    assert round(true["down"] * 3600) == 121  # node-1 GPU 2 lost at 300 s: intervals (299, 300] .. (419, 420]
    # the hang: 4 GPUs for 60 s, plus the start-up and the checkpoints
    assert true["busy_not_productive"] * 3600 >= 4 * 60
    hours = compare(result.measured_gpu_hours, result.true_gpu_hours)
    assert hours["max_error_pct"] <= 2.0, hours
    assert hours["states"]["down"]["measured"] > 0


PLACED = """
name: truth-placed-on-slower-parts
seed: 9
duration: 600
interval: 1
cluster: {nodes: 2, gpus_per_node: 4, gpu_model: H100-SXM5-80GB}
jobs:
  - {name: mixed, kind: training, nodes: [node-0, node-1], step_time: 1.0, checkpoint_every: 900}
faults:
  - at: 0
    kind: slow_placement
    target: {job: mixed}
    params: {first_rank: 4, ranks: 4, slowdown: 1.2, clocks: true}
  - {at: 150, kind: gpu_slow, target: {node: node-0, gpu: 1}, params: {slowdown: 1.1}, duration: 150}
  - {at: 400, kind: gpu_slow, target: {node: node-1, gpu: 2}, params: {slowdown: 1.15}, duration: 150}
"""


def test_slower_parts_from_the_start_are_the_jobs_normal_pace_in_truth_and_measured(tmp_path: Path) -> None:
    # slow_placement is reported once as a P3 with its cost, not as lost GPU time: the slow group's
    # clocks are the job's normal. A fast GPU slowed to no lower than them slows nothing (150-300 s);
    # a slow-group GPU slowing further slows the whole job (400-550 s): 8 GPUs degraded for 150 s.
    path = tmp_path / "placed.yaml"
    path.write_text(PLACED)
    result = run_scenario(load_scenario(path))
    degraded_s = result.true_gpu_hours.get("degraded", 0.0) * 3600
    assert 8 * 130 <= degraded_s <= 8 * 160, result.true_gpu_hours
    hours = compare(result.measured_gpu_hours, result.true_gpu_hours)
    assert hours["max_error_pct"] <= 2.0, hours
