"""What the load generator sends: a simulated fleet's agent and SDK batches.

The values come from the cluster simulator (:mod:`gpuscope.sim`), so every node batch carries the
full GPU and node metric sets with realistic dynamics, driver events, and the training SDKs' step
records and heartbeats; faults are scenario faults, so what the hub must detect is what
``sim-eval`` scores. :mod:`gpuscope.loadgen.playback` pre-encodes them as binary frames for a
run; :func:`tick_bodies` simulates and encodes JSON tick by tick (for benchmarks of the JSON path).
The HTTP work happens in the sender processes (:mod:`gpuscope.loadgen.sender`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.kinds import HARD_FAULTS, rule_for_fault
from gpuscope.sim.scenario import FaultSpec, Scenario, parse_scenario


@dataclass(frozen=True, slots=True)
class FleetShape:
    """The simulated fleet: ``nodes`` agents of ``gpus_per_node`` GPUs, training jobs spanning
    ``job_nodes`` nodes each, and one inference service per 128 nodes (at least one)."""

    nodes: int = 1024
    gpus_per_node: int = 8
    job_nodes: int = 16
    step_time: float = 1.5
    seed: int = 11

    @property
    def service_nodes(self) -> int:
        return max(1, self.nodes // 128) if self.nodes >= 2 else 0


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One encoded batch and what it carries, for the sender to count once acknowledged."""

    sender: str  # the agent (node name) or SDK process that owns the batch: one in-order stream
    body: bytes
    rows: int  # entity rows over all frames (rows of the wide samples table)
    samples: int  # non-missing values
    events: int
    training: int
    #: events only, sent ahead of the sender's spool and marked urgent (see :func:`urgent_part`)
    urgent: bool = False


def describe(batch: Batch, body: bytes, urgent: bool = False) -> Outgoing:
    rows = sum(len(f.entities) for f in batch.frames)
    samples = sum(int(np.count_nonzero(~np.isnan(f.values))) for f in batch.frames)
    return Outgoing(batch.source, body, rows, samples, len(batch.events), len(batch.training), urgent)


def default_faults(shape: FleetShape, duration: float) -> list[dict[str, Any]]:
    """Faults spread over the run on distinct jobs: hard ones (DESIGN §6 budget) and slower ones.

    Runs shorter than two minutes get only an XID 79, the fault a short run can judge.
    """
    n, g, per_job = shape.nodes, shape.gpus_per_node, shape.job_nodes
    training_nodes = n - shape.service_nodes

    def node(fraction: float) -> str:
        return f"node-{min(training_nodes - 1, int(fraction * training_nodes))}"

    def job(fraction: float) -> str:
        return f"job-{min(training_nodes - 1, int(fraction * training_nodes)) // per_job}"

    gpu = min(3, g - 1)
    if duration < 120:
        return [{"at": round(duration * 0.4), "kind": "xid", "target": {"node": node(0.3), "gpu": gpu}}]
    return [
        {"at": round(duration * 0.25), "kind": "xid", "target": {"node": node(0.1), "gpu": gpu}},
        {"at": round(duration * 0.3), "kind": "thermal_throttle", "target": {"node": node(0.25), "gpu": 1}},
        {"at": round(duration * 0.4), "kind": "gpu_lost", "target": {"node": node(0.4), "gpu": g - 1}},
        {"at": round(duration * 0.5), "kind": "training_hang", "target": {"job": job(0.55)}},
        {"at": round(duration * 0.6), "kind": "rank_dropout", "target": {"job": job(0.7), "rank": 5}},
        {"at": round(duration * 0.7), "kind": "node_down", "target": {"node": node(0.85)}},
    ]


def scenario_doc(
    shape: FleetShape, duration: float, faults: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The scenario (DESIGN §4) of the fleet as a document: training jobs over all nodes but the
    service ones; ``faults`` None means :func:`default_faults`."""
    if shape.nodes < 1 or shape.gpus_per_node < 1 or shape.job_nodes < 1:
        raise ValueError("nodes, gpus_per_node and job_nodes must be at least 1")
    training_nodes = shape.nodes - shape.service_nodes
    jobs: list[dict[str, Any]] = []
    for j, lo in enumerate(range(0, training_nodes, shape.job_nodes)):
        nodes = [f"node-{k}" for k in range(lo, min(lo + shape.job_nodes, training_nodes))]
        jobs.append({"name": f"job-{j}", "kind": "training", "nodes": nodes, "step_time": shape.step_time})
    for s in range(shape.service_nodes):
        node = f"node-{training_nodes + s}"
        jobs.append({"name": f"svc-{s}", "kind": "inference", "nodes": [node], "rps": 40, "model": f"m{s}"})
    return {
        "name": f"load-{shape.nodes}x{shape.gpus_per_node}",
        "seed": shape.seed,
        "duration": duration,
        "interval": 1,
        "cluster": {"nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node},
        "jobs": jobs,
        "faults": faults if faults is not None else default_faults(shape, duration),
    }


def parse_doc(doc: dict[str, Any]) -> Scenario:
    return parse_scenario(yaml.safe_dump(doc, sort_keys=False), name=str(doc["name"]) + ".yaml")


def build_scenario(
    shape: FleetShape, duration: float, faults: list[dict[str, Any]] | None = None
) -> Scenario:
    """The parsed scenario of :func:`scenario_doc`."""
    return parse_doc(scenario_doc(shape, duration, faults))


@dataclass(frozen=True, slots=True)
class ExpectedAlert:
    """A fault injected during the load and the alert it must raise."""

    fault: FaultSpec
    rule: str
    at_wall: float  # the fault's onset on the wall clock

    @property
    def hard(self) -> bool:
        return self.fault.kind in HARD_FAULTS

    def matches(self, alert: dict[str, Any]) -> bool:
        entity = alert.get("entity") or {}
        return alert.get("rule") == self.rule and all(
            str(entity.get(k)) == str(v) for k, v in self.fault.target.items()
        )


def expected_alerts(scenario: Scenario, t0: float) -> list[ExpectedAlert]:
    return [ExpectedAlert(f, rule_for_fault(f.kind, f.params), t0 + f.at) for f in scenario.faults]


def tick_bodies(scenario: Scenario, t0: float) -> Iterator[tuple[float, list[Outgoing]]]:
    """Per sampling interval: its wall time (``t0`` + simulated seconds) and every batch due then."""
    sim = Simulator(scenario, t0=t0)
    for tick in sim.ticks():
        batches = [*tick.node_batches.values(), *tick.sdk_batches]
        yield t0 + tick.t, [describe(b, encode_batch(b)) for b in batches]


def shard_of(sender: str, shards: int) -> int:
    """A stable choice among ``shards`` (worker processes, hubs) for one sender's stream."""
    return zlib.crc32(sender.encode()) % shards
