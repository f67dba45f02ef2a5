"""Run a scenario and keep everything it sent, with small queries for the tests."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpuscope.model import Batch, Event, Labels, TrainingRecord
from gpuscope.sim import Scenario, Simulator, parse_scenario
from gpuscope.sim.cluster import Tick

Array = np.ndarray


@dataclass
class Trace:
    scenario: Scenario
    ticks: int = 0
    batches: list[Batch] = field(default_factory=list)
    gpu_rows: dict[tuple[str, str], list[tuple[float, Array, str | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    gpu_cols: dict[str, int] = field(default_factory=dict)
    node_rows: dict[str, list[tuple[float, Array]]] = field(default_factory=lambda: defaultdict(list))
    node_cols: dict[str, int] = field(default_factory=dict)
    svc_rows: list[tuple[float, Labels, Array]] = field(default_factory=list)
    svc_cols: dict[str, int] = field(default_factory=dict)
    node_batch_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    all_events: list[Event] = field(default_factory=list)
    training: list[TrainingRecord] = field(default_factory=list)
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)

    def add(self, tick: Tick) -> None:
        self.ticks += 1
        for f in tick.faults_started:
            self.started[f.index] = tick.t
        for f in tick.faults_ended:
            self.ended[f.index] = tick.t
        for node, batch in tick.node_batches.items():
            self.batches.append(batch)
            self.node_batch_times[node].append(tick.t)
            gpu, host, *svc = batch.frames
            self.gpu_cols = {m: j for j, m in enumerate(gpu.metrics)}
            self.node_cols = {m: j for j, m in enumerate(host.metrics)}
            for ent, row in zip(gpu.entities, gpu.values, strict=True):
                self.gpu_rows[(ent["node"], ent["gpu"])].append((gpu.ts, row, ent.get("job")))
            self.node_rows[node].append((host.ts, host.values[0]))
            for frame in svc:
                self.svc_cols = {m: j for j, m in enumerate(frame.metrics)}
                for ent, row in zip(frame.entities, frame.values, strict=True):
                    self.svc_rows.append((frame.ts, ent, row))
            self.all_events.extend(batch.events)
        for batch in tick.sdk_batches:
            self.batches.append(batch)
            self.all_events.extend(batch.events)
            self.training.extend(batch.training)

    # -- queries ----------------------------------------------------------------------------------

    def gpu(self, node: str, gpu: int | str, metric: str, t0: float = -1.0, t1: float = 1e18) -> Array:
        j = self.gpu_cols[metric]
        return np.array([row[j] for ts, row, _ in self.gpu_rows[(node, str(gpu))] if t0 <= ts < t1])

    def gpu_times(self, node: str, gpu: int | str) -> list[float]:
        return [ts for ts, _, _ in self.gpu_rows[(node, str(gpu))]]

    def gpu_jobs(self, node: str, gpu: int | str) -> list[tuple[float, str | None]]:
        return [(ts, job) for ts, _, job in self.gpu_rows[(node, str(gpu))]]

    def node(self, node: str, metric: str, t0: float = -1.0, t1: float = 1e18) -> Array:
        j = self.node_cols[metric]
        return np.array([row[j] for ts, row in self.node_rows[node] if t0 <= ts < t1])

    def service(self, metric: str, t0: float = -1.0, t1: float = 1e18) -> Array:
        j = self.svc_cols[metric]
        return np.array([row[j] for ts, _, row in self.svc_rows if t0 <= ts < t1])

    def service_labels(self, t0: float = -1.0, t1: float = 1e18) -> list[Labels]:
        return [labels for ts, labels, _ in self.svc_rows if t0 <= ts < t1]

    def events(self, kind: str, **labels: str) -> list[Event]:
        return [
            e
            for e in self.all_events
            if e.kind == kind and all(e.labels.get(k) == v for k, v in labels.items())
        ]

    def beats(self, job: str, rank: int, t0: float = -1.0, t1: float = 1e18) -> list[float]:
        return [e.ts for e in self.events("heartbeat", job=job, rank=str(rank)) if t0 <= e.ts < t1]

    def records(
        self, job: str, rank: int | None = None, t0: float = -1.0, t1: float = 1e18
    ) -> list[TrainingRecord]:
        return [
            r for r in self.training if r.job == job and (rank is None or r.rank == rank) and t0 <= r.ts < t1
        ]

    def metric(
        self, job: str, name: str, rank: int | None = None, t0: float = -1.0, t1: float = 1e18
    ) -> Array:
        return np.array([r.metrics[name] for r in self.records(job, rank, t0, t1)])

    def steps(self, job: str, t0: float = -1.0, t1: float = 1e18) -> list[int]:
        return sorted({r.step for r in self.records(job, None, t0, t1)})


def run(scenario: Scenario | str, t0: float = 0.0) -> Trace:
    sc = parse_scenario(scenario, name="test.yaml") if isinstance(scenario, str) else scenario
    trace = Trace(sc)
    for tick in Simulator(sc, t0=t0).ticks():
        trace.add(tick)
    return trace


# A small cluster for fault tests: "train" has ranks 0-3 on node-0 and 4-7 on node-1 (rank 5 is
# node-1 GPU 1); "chat" serves from node-2 GPUs 0-2; node-2 GPU 3 stays idle.
SMALL = """\
seed: {seed}
duration: {duration}
interval: 1
cluster: {{nodes: 3, gpus_per_node: 4, gpu_model: H100-SXM5-80GB}}
jobs:
  - {{name: train, kind: training, nodes: [node-0, node-1], step_time: 1.0, checkpoint_every: 120,
     checkpoint_seconds: 12, collective_timeout: 200}}
  - {{name: chat, kind: inference, nodes: [node-2], gpus: [0, 1, 2], rps: 30, model: chat, version: v3}}
faults:
{faults}
"""


def small(faults: str = "  []", duration: int = 600, seed: int = 5) -> str:
    if faults.strip().startswith("-"):
        faults = "\n".join("  " + line.strip() for line in faults.strip().splitlines())
    return SMALL.format(seed=seed, duration=duration, faults=faults if faults.strip() != "[]" else "  []")
