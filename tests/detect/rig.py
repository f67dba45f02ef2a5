"""Test rig for detectors: a small fake cluster and training jobs that emit the SIGNAL CONTRACT's
batches tick by tick, and a driver that runs them through DetectionEngine + AlertEngine.

Faults are injected by editing the cluster (a GPU missing, a node down, metric overrides) or a
job (hung, a dead rank, a checkpoint window) between ticks; the driver records every alert change
with the tick time it happened at.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuscope.alert.engine import AlertChange, AlertEngine
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.model import Alert, Batch, Event, Frame, TrainingRecord

GPU_BASE: dict[str, float] = {
    "gpu_utilization_percent": 96.0,
    "gpu_sm_active_ratio": 0.7,
    "gpu_memory_utilization_percent": 40.0,
    "gpu_memory_used_bytes": 70e9,
    "gpu_memory_total_bytes": 80e9,
    "gpu_temp_celsius": 66.0,
    "gpu_memory_temp_celsius": 70.0,
    "gpu_power_watts": 600.0,
    "gpu_power_limit_watts": 700.0,
    "gpu_sm_clock_mhz": 1980.0,
    "gpu_clock_event_reasons": 0.0,
    "gpu_throttle_sw_power": 0.0,
    "gpu_throttle_hw_slowdown": 0.0,
    "gpu_throttle_sw_thermal": 0.0,
    "gpu_throttle_hw_thermal": 0.0,
    "gpu_ecc_sbe_volatile_total": 0.0,
    "gpu_ecc_dbe_volatile_total": 0.0,
    "gpu_ecc_sbe_aggregate_total": 2.0,
    "gpu_ecc_dbe_aggregate_total": 0.0,
    "gpu_remapped_rows_uncorrectable": 0.0,
    "gpu_remapped_rows_failure": 0.0,
}
IDLE = {
    "gpu_utilization_percent": 0.0,
    "gpu_sm_active_ratio": 0.0,
    "gpu_temp_celsius": 34.0,
    "gpu_power_watts": 70.0,
}
NODE_BASE: dict[str, float] = {"node_cpu_percent": 35.0, "node_load1": 12.0, "node_memory_used_bytes": 2e11}


@dataclass
class FakeCluster:
    """Nodes ``node-0..`` with ``gpus`` GPUs each; every tick each live node sends one batch."""

    nodes: int = 2
    gpus: int = 8
    jitter: float = 0.0  # +- seconds on each node's timestamps
    noise: float = 1.0  # degrees / percent of noise on gauges
    seed: int = 0
    overrides: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    missing: set[tuple[str, str]] = field(default_factory=set)  # GPUs absent from their node's frames
    blank: set[tuple[str, str]] = field(default_factory=set)  # GPUs reported with every value missing
    down: set[str] = field(default_factory=set)  # nodes that send nothing
    jobs: dict[tuple[str, str], str] = field(default_factory=dict)  # GPU -> job it is allocated to
    pending_events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.metrics = list(GPU_BASE)

    @property
    def names(self) -> list[str]:
        return [f"node-{n}" for n in range(self.nodes)]

    def allocate(self, job: str, placement: Iterable[tuple[int, str, str]]) -> None:
        for _, node, gpu in placement:
            self.jobs[(node, gpu)] = job

    def free(self, job: str) -> None:
        for key in [k for k, v in self.jobs.items() if v == job]:
            del self.jobs[key]

    def event(self, ts: float, kind: str, node: str, gpu: str, **data: Any) -> None:
        """Queue a node event (xid, ecc_dbe, gpu_lost) for the node's next batch."""
        self.pending_events.append(Event(ts, kind, {"node": node, "gpu": gpu}, data))

    def gpu_values(self, node: str, gpu: str) -> list[float]:
        key = (node, gpu)
        if key in self.blank:
            return [float("nan")] * len(self.metrics)
        values = dict(GPU_BASE) if key in self.jobs else {**GPU_BASE, **IDLE}
        values.update(self.overrides.get(key, {}))
        for metric in ("gpu_utilization_percent", "gpu_temp_celsius"):
            if metric not in self.overrides.get(key, {}):
                values[metric] = max(0.0, values[metric] + self._rng.uniform(-self.noise, self.noise))
        return [values[m] for m in self.metrics]

    def batch(self, t: float, node: str) -> Batch:
        ts = t + (self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
        entities: list[dict[str, str]] = []
        rows: list[list[float]] = []
        for g in range(self.gpus):
            gpu = str(g)
            if (node, gpu) in self.missing:
                continue
            labels = {"node": node, "gpu": gpu, "uuid": f"GPU-{node}-{gpu}"}
            if (node, gpu) in self.jobs:
                labels["job"] = self.jobs[(node, gpu)]
            entities.append(labels)
            rows.append(self.gpu_values(node, gpu))
        values = np.array(rows, dtype=np.float64).reshape(len(rows), len(self.metrics))
        frames = [
            Frame(ts, list(self.metrics), entities, values),
            Frame(ts, list(NODE_BASE), [{"node": node}], np.array([list(NODE_BASE.values())])),
        ]
        events = [e for e in self.pending_events if e.labels["node"] == node]
        self.pending_events = [e for e in self.pending_events if e.labels["node"] != node]
        return Batch(source=node, frames=frames, events=events)

    def batches(self, t: float) -> list[Batch]:
        return [self.batch(t, node) for node in self.names if node not in self.down]


@dataclass
class FakeJob:
    """A synchronous data-parallel training job: one rank per GPU, all ranks step together."""

    name: str
    placement: list[tuple[int, str, str]]
    step_time: float = 1.0
    start: float = 0.0
    init: float = 5.0  # seconds from start to the first step
    hung: bool = False  # processes alive (heartbeats) but no more steps
    dead: set[int] = field(default_factory=set)  # ranks whose process died: no heartbeats, no steps
    checkpoint: tuple[float, float] | None = None  # (start, seconds) of the current checkpoint
    ended: bool = False
    started_sent: bool = False
    step: int = 0
    next_step_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_step_at = self.start + self.init

    @staticmethod
    def on(nodes: list[str], gpus: int, name: str = "llm", **kw: Any) -> FakeJob:
        placement = [(r, nodes[r // gpus], str(r % gpus)) for r in range(len(nodes) * gpus)]
        return FakeJob(name, placement, **kw)

    def start_checkpoint(self, t: float, seconds: float) -> None:
        self.checkpoint = (t, seconds)

    def end(self, t: float, *, failed: bool = False) -> Batch:
        self.ended = True
        kind = "job_failed" if failed else "job_ended"
        data = {"reason": "crash", "exit_code": 1} if failed else {}
        return Batch(source=f"sdk:{self.name}", events=[Event(t, kind, {"job": self.name}, data)])

    def _labels(self, rank: int, node: str, gpu: str) -> dict[str, str]:
        return {"job": self.name, "rank": str(rank), "node": node, "gpu": gpu}

    def batch(self, t: float, dt: float = 1.0) -> Batch | None:
        """Everything the job's ranks report for the tick ending at ``t``."""
        if self.ended or t < self.start:
            return None
        events: list[Event] = []
        records: list[TrainingRecord] = []
        if not self.started_sent:
            self.started_sent = True
            placement = [list(p) for p in self.placement]
            data = {"kind": "training", "placement": placement, "world_size": len(self.placement)}
            events.append(Event(self.start, "job_started", {"job": self.name}, data))
        alive = [p for p in self.placement if p[0] not in self.dead]
        if self.checkpoint is not None:
            c_start, c_len = self.checkpoint
            if t - dt < c_start <= t:
                events += [
                    Event(c_start, "checkpoint_started", self._labels(*p), {"step": self.step}) for p in alive
                ]
            if c_start + c_len <= t:
                done = {"step": self.step, "bytes": 1e9, "seconds": c_len}
                events += [
                    Event(c_start + c_len, "checkpoint_completed", self._labels(*p), done) for p in alive
                ]
                self.checkpoint = None
                self.next_step_at = max(self.next_step_at, c_start + c_len + self.step_time)
        can_step = not self.hung and not self.dead and self.checkpoint is None
        while can_step and self.next_step_at <= t:
            self.step += 1
            for rank, node, gpu in alive:
                metrics = {"loss": 2.0, "step_seconds": self.step_time, "tokens_per_second": 1e5}
                records.append(
                    TrainingRecord(
                        self.next_step_at, self.name, rank, self.step, metrics, {"node": node, "gpu": gpu}
                    )
                )
            self.next_step_at += self.step_time
        events += [Event(t, "heartbeat", self._labels(*p), {"step": self.step}) for p in alive]
        return Batch(source=f"sdk:{self.name}", events=events, training=records)


class Driver:
    """Runs batches through detection and alerting, one evaluation per tick, recording changes."""

    def __init__(self, detectors: list[Detector] | None = None, resolve_after: float = 5.0) -> None:
        self.detection = DetectionEngine(detectors)
        self.alerts = AlertEngine(resolve_after=resolve_after)
        self.changes: list[tuple[float, AlertChange]] = []

    def tick(self, t: float, batches: Iterable[Batch | None]) -> list[AlertChange]:
        for batch in batches:
            if batch is not None:
                self.detection.observe(batch)
        changes = self.alerts.update(t, self.detection.evaluate(t))
        self.changes.extend((t, c) for c in changes)
        return changes

    def run(
        self, start: float, stop: float, make: Callable[[float], Iterable[Batch | None]], step: float = 1.0
    ) -> None:
        """Tick from ``start`` to ``stop`` (exclusive) every ``step`` seconds."""
        t = start
        while t < stop - 1e-9:
            self.tick(t, make(t))
            t += step

    def alerts_of(self, rule: str | None = None) -> list[Alert]:
        return [a for a in self.alerts.all() if rule is None or a.rule == rule]

    def only(self, rule: str) -> Alert:
        found = self.alerts_of(rule)
        assert len(found) == 1, f"expected one {rule} alert, got {[a.to_dict() for a in found]}"
        return found[0]

    def serious(self) -> list[Alert]:
        return [a for a in self.alerts.all() if a.severity in ("P1", "P2")]
