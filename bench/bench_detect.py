"""Detection CPU cost at fleet scale: 8,192 GPUs (1,024 nodes x 8) reporting at 1 Hz.

Every simulated second, each node sends one batch (a GPU frame with every standard GPU metric and
a node frame) and every training job sends its ranks' heartbeats and step records; the engine
observes all of them and evaluates once. The time spent in ``observe`` + ``evaluate`` per simulated
second is the share of one core detection needs (budget: 20 %). Building the batches is not timed.
A second pass times each detector separately to show where the cost goes.

usage: python bench/bench_detect.py [--seconds 60] [--nodes 1024] [--no-training] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common import print_table
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.model import Batch, Event, Frame, TrainingRecord
from gpuscope.signals import GPU_METRICS, NODE_METRICS

BUDGET = 0.20
GPUS = 8
NODES_PER_JOB = 64
WARMUP = 5  # seconds excluded from the figures while baselines are learned

LEVELS = {
    "gpu_utilization_percent": (95, 4),
    "gpu_temp_celsius": (66, 2),
    "gpu_power_watts": (600, 40),
    "gpu_memory_temp_celsius": (71, 2),
    "gpu_sm_clock_mhz": (1980, 10),
    "gpu_power_limit_watts": (700, 0),
    "gpu_memory_total_bytes": (80e9, 0),
    "gpu_memory_used_bytes": (70e9, 1e8),
}


class Fleet:
    """Synthetic telemetry for ``nodes`` x 8 GPUs and its training jobs, one second at a time."""

    def __init__(self, nodes: int, training: bool, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes = [f"node-{n}" for n in range(nodes)]
        self.gpu_metrics = list(GPU_METRICS)
        self.node_metrics = list(NODE_METRICS)
        self.level = np.array([LEVELS.get(m, (0.0, 0.0))[0] for m in self.gpu_metrics])
        self.noise = np.array([LEVELS.get(m, (0.0, 0.0))[1] for m in self.gpu_metrics])
        self.jobs = [f"job-{j}" for j in range(nodes // NODES_PER_JOB)] if training else []
        self.entities = [
            [{"node": node, "gpu": str(g), "uuid": f"GPU-{n}-{g}", **self._job_label(n)} for g in range(GPUS)]
            for n, node in enumerate(self.nodes)
        ]
        self.step = 0

    def _job_label(self, n: int) -> dict[str, str]:
        job = n // NODES_PER_JOB
        return {"job": self.jobs[job]} if job < len(self.jobs) else {}

    def second(self, t: float) -> list[Batch]:
        count = len(self.nodes) * GPUS
        values = self.level + self.rng.standard_normal((count, len(self.gpu_metrics))) * self.noise
        node_values = np.abs(self.rng.standard_normal((len(self.nodes), len(self.node_metrics))))
        batches = []
        for n, node in enumerate(self.nodes):
            frames = [
                Frame(t, self.gpu_metrics, self.entities[n], values[n * GPUS : (n + 1) * GPUS]),
                Frame(t, self.node_metrics, [{"node": node}], node_values[n : n + 1]),
            ]
            batches.append(Batch(source=node, frames=frames))
        self.step += 1
        for j, job in enumerate(self.jobs):
            events, records = [], []
            for rank in range(NODES_PER_JOB * GPUS):
                node, gpu = self.nodes[j * NODES_PER_JOB + rank // GPUS], str(rank % GPUS)
                labels = {"job": job, "rank": str(rank), "node": node, "gpu": gpu}
                events.append(Event(t, "heartbeat", labels, {"step": self.step}))
                records.append(
                    TrainingRecord(
                        t - 0.1,
                        job,
                        rank,
                        self.step,
                        {"loss": 2.0, "step_seconds": 1.0},
                        {"node": node, "gpu": gpu},
                    )
                )
            batches.append(Batch(source=f"sdk:{job}", events=events, training=records))
        return batches


def run(engine: DetectionEngine, fleet: Fleet, seconds: int) -> tuple[list[float], int]:
    """Seconds of CPU spent per simulated second, and the findings of the last evaluation."""
    spent: list[float] = []
    findings = 0
    for s in range(seconds):
        t = 1_700_000_000.0 + s
        batches = fleet.second(t)
        start = time.process_time()
        for batch in batches:
            engine.observe(batch)
        findings = len(engine.evaluate(t + 0.5))
        spent.append(time.process_time() - start)
    return spent[WARMUP:], findings


def timed(detector: Detector, totals: dict[str, float]) -> Detector:
    """Wrap a detector's hooks (on the instance) so each adds its CPU time to ``totals``."""
    name = type(detector).__name__
    for hook in ("on_frame", "on_event", "on_training", "evaluate"):
        method = getattr(detector, hook)

        def wrapper(arg: Any, _method: Callable[[Any], Any] = method) -> Any:
            start = time.process_time()
            try:
                return _method(arg)
            finally:
                totals[name] = totals.get(name, 0.0) + time.process_time() - start

        setattr(detector, hook, wrapper)
    return detector


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60, help="simulated seconds (the first 5 are warm-up)")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--no-training", action="store_true", help="GPU and node frames only")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.seconds <= WARMUP:
        ap.error(f"--seconds must be more than the {WARMUP} s warm-up")
    training = not args.no_training

    spent, findings = run(DetectionEngine(), Fleet(args.nodes, training), args.seconds)
    totals: dict[str, float] = {}
    probe = DetectionEngine([timed(d, totals) for d in DetectionEngine().detectors])
    run(probe, Fleet(args.nodes, training), min(args.seconds, 20))

    gpus = args.nodes * GPUS
    ranks = len(Fleet(args.nodes, training).jobs) * NODES_PER_JOB * GPUS
    mean = statistics.fmean(spent)
    p95 = sorted(spent)[int(0.95 * (len(spent) - 1))]
    share = mean / 1.0
    result = {
        "gpus": gpus,
        "nodes": args.nodes,
        "ranks": ranks,
        "simulated_seconds": len(spent),
        "cpu_seconds_per_simulated_second_mean": mean,
        "p95": p95,
        "max": max(spent),
        "share_of_one_core": share,
        "budget": BUDGET,
        "within_budget": share <= BUDGET,
        "findings_at_end": findings,
        "per_detector_share": {k: v / min(args.seconds, 20) for k, v in sorted(totals.items())},
    }
    rows = [
        ["observe + evaluate, mean", f"{mean * 1e3:.1f} ms", f"{share:.1%}"],
        ["p95 of simulated seconds", f"{p95 * 1e3:.1f} ms", f"{p95:.1%}"],
        ["max", f"{max(spent) * 1e3:.1f} ms", f"{max(spent):.1%}"],
    ]
    rows += [
        [f"  {name}", f"{v * 1e3:.1f} ms", f"{v:.1%}"] for name, v in result["per_detector_share"].items()
    ]
    print_table(
        f"Detection cost: {gpus:,} GPUs, {args.nodes:,} nodes, {ranks:,} training ranks at 1 Hz "
        f"(budget {BUDGET:.0%} of one core)",
        ["what", "CPU per simulated second", "share of one core"],
        rows,
    )
    print(f"{'PASS' if share <= BUDGET else 'FAIL'}: {share:.1%} of one core (budget {BUDGET:.0%})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
