"""An LLM inference service: diurnal demand, a queue, and latency that depends on load.

Demand is ``rps`` shaped by a 24-hour cosine (peak at ``peak_at``) and a slow random burst
factor, with Poisson arrivals each tick. The service serves up to its capacity (proportional to
the replicas alive); what it cannot serve waits in a queue, which adds to latency and, past a
limit, is rejected as errors. Latency and time to first token grow with utilisation like a
queueing system; the KV cache fills with the requests in flight (Little's law). Past 95 % the
cache preempts requests; a preempted request is evicted and recomputed later, so once a few
percent of requests (smoothed over half a minute) are preempted, the tail latency and the time
to first token are made of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuscope.model import Event, FloatArray, Frame
from gpuscope.signals import SERVICE_METRICS
from gpuscope.sim.gpus import Demand, GpuFleet
from gpuscope.sim.nodes import NodeFleet
from gpuscope.sim.quality import QualityConditions, ServiceQuality
from gpuscope.sim.scenario import JobSpec

SERVICE_COLUMNS: tuple[str, ...] = tuple(SERVICE_METRICS)
SCOL = {name: j for j, name in enumerate(SERVICE_COLUMNS)}
MAX_RUNNING_PER_REPLICA = 32
DAY = 86400.0
IntArray = np.ndarray[tuple[int], np.dtype[np.int64]]
BoolArray = np.ndarray[tuple[int], np.dtype[np.bool_]]


@dataclass(slots=True)
class ServiceConditions:
    """What active faults do to a service; rebuilt whenever a fault starts or ends."""

    latency: float = 1.0
    ttft: float = 1.0
    error: float = 0.0
    capacity: float = math.inf  # absolute requests/s the service can still serve
    kv_usage: float | None = None
    idle: bool = False
    version: str | None = None
    quality: QualityConditions = field(default_factory=QualityConditions)


class InferenceService:
    def __init__(self, spec: JobSpec, fleet: GpuFleet, nodes: NodeFleet, rng: np.random.Generator) -> None:
        self.spec = spec
        self.fleet = fleet
        self.nodes = nodes
        self.rng = rng
        per = fleet.per_node
        node_pos = {name: k for k, name in enumerate(fleet.nodes)}
        slots = [(n, g) for n in spec.nodes for g in spec.gpus]
        self.gpu_idx: IntArray = np.array([node_pos[n] * per + g for n, g in slots], dtype=np.int64)
        self.node_idx: IntArray = np.array([node_pos[n] for n, _ in slots], dtype=np.int64)
        self.replica_nodes = [n for n, _ in slots]
        self.placement = [[r, n, g] for r, (n, g) in enumerate(slots)]
        self.capacity = spec.capacity_rps or spec.rps * (1.0 + spec.diurnal_amplitude) * 1.8
        self.state = "pending"
        self.cond = ServiceConditions()
        self.backlog = 0.0
        self.burst = 0.0
        self.preempt_share = 0.0  # preempted share of requests, smoothed over ~30 s
        self.preemptions = {n: 0.0 for n in spec.nodes}
        self.demand_rps = spec.rps
        self.rho = 0.0
        self.events: list[Event] = []
        self.frames: list[Frame] = []  # what the service's SDK reports (business metrics)
        # its own stream, so the model-quality draws leave the serving noise as it was
        self.quality = ServiceQuality(rng.spawn(1)[0], spec.peak_at, spec.start)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def version(self) -> str:
        return self.cond.version or self.spec.version

    def _labels(self) -> dict[str, str]:
        return {"service": self.name, "model": self.spec.model, "version": self.version}

    def start(self, t: float) -> None:
        data = {
            "kind": "inference",
            "service": self.name,
            "model": self.spec.model,
            "version": self.version,
            "placement": self.placement,
        }
        self.events.append(Event(t, "job_started", {"job": self.name}, data))
        self.state = "running"
        self.backlog = 0.0
        self.quality.restart(t)

    def restart(self, t: float) -> None:
        if self.state == "failed" and t < self.spec.end:
            self.start(t)

    def end(self, t: float) -> None:
        if self.running:
            self.events.append(Event(t, "job_ended", {"job": self.name}))
        if self.state in ("running", "pending"):
            self.state = "ended"

    def fail(self, t: float, reason: str, exit_code: int) -> None:
        if self.running:
            self.events.append(
                Event(t, "job_failed", {"job": self.name}, {"reason": reason, "exit_code": exit_code})
            )
            self.state = "failed"

    def promote(self, t: float, version: str) -> None:
        """A model version starts serving (a rollout, or a rollback)."""
        data = {"model": self.spec.model, "version": version, "service": self.name}
        self.events.append(
            Event(
                t,
                "model_version_promoted",
                {"service": self.name, "model": self.spec.model, "version": version},
                data,
            )
        )

    def mean_demand(self, t: float) -> float:
        s = self.spec
        return s.rps * (1.0 + s.diurnal_amplitude * math.cos(2.0 * math.pi * (t - s.peak_at) / DAY))

    def sample(
        self, t: float, dt: float, d: Demand, up_nodes: set[str]
    ) -> list[tuple[str, dict[str, str], FloatArray]]:
        """Serve one tick; fill GPU demand; return one (node, labels, metrics row) per node that reports."""
        if not self.running:
            return []
        rng, c = self.rng, self.cond
        for i in self.gpu_idx.tolist():
            d.jobs[i] = self.name
        alive = self.fleet.usable[self.gpu_idx]
        n_alive = int(alive.sum())
        live = self.gpu_idx[alive]
        d.mem[live] = self.spec.memory_fraction * self.fleet.model.memory_bytes
        np.add.at(self.nodes.host_mem, self.node_idx[alive], 20 * 1024**3)

        # slow burstiness on top of the diurnal curve: an OU process, 10 % spread, 2-minute memory
        self.burst += -self.burst * dt / 120.0 + 0.1 * math.sqrt(2.0 * dt / 120.0) * float(
            rng.standard_normal()
        )
        lam = 0.0 if c.idle else self.mean_demand(t) * math.exp(self.burst)
        self.demand_rps = lam
        arrivals = float(rng.poisson(lam * dt))
        cap = min(self.capacity * n_alive / len(self.gpu_idx), c.capacity)
        total = self.backlog + arrivals
        served = min(total, cap * dt * (1.0 + 0.02 * float(rng.standard_normal()))) if cap > 0 else 0.0
        served = max(served, 0.0)
        backlog = total - served
        rejected = max(0.0, backlog - 30.0 * max(cap, 1.0))
        self.backlog = backlog - rejected
        rho = min(lam / cap, 0.97) if cap > 0 else 0.97
        self.rho = rho
        wait = self.backlog / cap if cap > 0 else 0.0
        z = rng.standard_normal(6)
        s = self.spec
        p50 = s.latency_seconds * (1.0 + 0.35 * rho + 0.05 * rho**4 / (1.0 - rho)) * c.latency + wait
        p50 *= math.exp(0.04 * z[0])
        p95 = p50 * (2.0 + 0.08 * z[1])
        p99 = p95 * (1.45 + 0.06 * abs(z[2]))
        ttft = (s.ttft_seconds * (1.0 + 2.0 * rho**2) * c.ttft + wait) * math.exp(0.05 * z[3])
        itl = 0.02 * (1.0 + 0.6 * rho) * c.latency * math.exp(0.04 * z[4])
        p_err = min(1.0, s.error_rate + c.error)
        errors = float(rng.binomial(int(served), p_err)) + rejected if served >= 1 else rejected
        if n_alive == 0:
            errors += arrivals
        slots = MAX_RUNNING_PER_REPLICA * max(n_alive, 1)
        running = min(served / dt * min(p50, 30.0), float(slots))
        kv = 0.1 + 0.85 * running / slots + 0.01 * z[5]
        ok = served * (1.0 - p_err) if n_alive else 0.0
        events, frames = self.quality.step(t, ok, self._labels() | {"node": self.spec.nodes[0]}, c.quality)
        self.events += events
        self.frames += frames
        if c.kv_usage is not None:
            kv = c.kv_usage + 0.006 * z[5]
        kv = float(np.clip(kv, 0.0, 1.0))
        preempt = float(rng.poisson(lam * dt * 0.05 * (kv - 0.95) / 0.05)) if kv > 0.95 else 0.0
        share_now = preempt / max(lam * dt, 1.0)
        self.preempt_share += (share_now - self.preempt_share) * min(dt / 30.0, 1.0)
        hit = min(self.preempt_share / 0.05, 1.0)  # at 5 % preempted the p95 request is a preempted one
        p50, p95, p99 = p50 * (1.0 + 0.2 * hit), p95 * (1.0 + hit), p99 * (1.0 + hit)
        ttft *= 1.0 + 2.0 * hit

        if live.size and not c.idle:
            d.active[live] = True
            d.util[live] = np.clip(30.0 + 65.0 * rho + 3.0 * rng.standard_normal(live.size), 1.0, 100.0)
            d.sm[live] = 0.12 + 0.45 * rho
            d.power[live] = 0.25 + 0.55 * rho
            d.mem_util[live] = 15.0 + 55.0 * rho
            d.pcie[live] = 3e8
            np.add.at(self.nodes.busy_gpus, self.node_idx[alive], rho)

        rows: list[tuple[str, dict[str, str], FloatArray]] = []
        nodes_up = [n for n in self.spec.nodes if n in up_nodes]
        for node in nodes_up:
            on_node = sum(1 for k, n in enumerate(self.replica_nodes) if n == node and alive[k])
            share = on_node / n_alive if n_alive else 1.0 / len(nodes_up)
            self.preemptions[node] += preempt * share
            row = np.full(len(SERVICE_COLUMNS), np.nan)  # a metric this model does not report is absent
            row[SCOL["inference_requests_per_second"]] = served / dt * share
            row[SCOL["inference_errors_per_second"]] = errors / dt * share
            row[SCOL["inference_latency_p50_seconds"]] = p50
            row[SCOL["inference_latency_p95_seconds"]] = p95
            row[SCOL["inference_latency_p99_seconds"]] = p99
            row[SCOL["inference_ttft_p95_seconds"]] = ttft
            row[SCOL["inference_itl_p95_seconds"]] = itl
            row[SCOL["inference_queue_depth"]] = round(
                self.backlog * share + float(rng.poisson(rho**2 / (1 - rho)))
            )
            row[SCOL["inference_running_requests"]] = round(running * share)
            row[SCOL["inference_batch_size"]] = running / max(n_alive, 1)
            row[SCOL["inference_kv_cache_usage_ratio"]] = kv
            row[SCOL["inference_preemptions_total"]] = round(self.preemptions[node])
            labels = self._labels() | {"node": node}
            rows.append((node, labels, row))
        return rows
