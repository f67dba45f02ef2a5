"""The simulated cluster's state: GPUs, hosts, jobs, services, and what faults do to them.

Fault effects (:mod:`gpuscope.sim.faults`) work on this object: they kill processes, emit the
driver's events, and set conditions. Conditions are rebuilt from the active effects whenever a
fault starts or ends (:meth:`World.refresh`), so overlapping faults compose and a fault that
ends leaves nothing behind except what really persists (lifetime counters, remapped rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from gpuscope.counters import Counters
from gpuscope.model import Event
from gpuscope.sim.gpus import GpuFleet
from gpuscope.sim.inference import InferenceService, ServiceConditions
from gpuscope.sim.nodes import NodeFleet
from gpuscope.sim.scenario import Scenario
from gpuscope.sim.training import JobConditions, TrainingJob


class ActiveEffect(Protocol):
    def apply(self) -> None: ...

    def advance(self, t: float) -> None: ...


class World:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        cluster = scenario.cluster
        streams = np.random.SeedSequence(scenario.seed).spawn(2 + len(scenario.jobs))
        self.node_names = cluster.node_names
        self.per_node = cluster.gpus_per_node
        self.fleet = GpuFleet(
            self.node_names, self.per_node, cluster.hardware, scenario.seed, np.random.default_rng(streams[0])
        )
        self.nodes = NodeFleet(self.node_names, np.random.default_rng(streams[1]))
        self.node_pos = {name: k for k, name in enumerate(self.node_names)}
        self.jobs: dict[str, TrainingJob] = {}
        self.services: dict[str, InferenceService] = {}
        for spec, stream in zip(scenario.jobs, streams[2:], strict=True):
            rng = np.random.default_rng(stream)
            if spec.kind == "training":
                self.jobs[spec.name] = TrainingJob(spec, self.fleet, self.nodes, rng)
            else:
                self.services[spec.name] = InferenceService(spec, self.fleet, self.nodes, rng)
        self.node_events: list[list[Event]] = [[] for _ in self.node_names]
        self.active: list[ActiveEffect] = []
        self.restarts: list[Callable[[float], None]] = []
        self.counters = Counters()

    # -- lookups ----------------------------------------------------------------------------------

    def gpu(self, node: str, gpu: int) -> int:
        return self.node_pos[node] * self.per_node + gpu

    def training_ranks_on(self, i: int) -> list[tuple[TrainingJob, int]]:
        """Running training ranks placed on GPU ``i``."""
        return [(job, r) for job in self.jobs.values() if job.running for r in job.ranks_on_gpu(i)]

    def job_on_gpu(self, i: int) -> TrainingJob | None:
        ranks = self.training_ranks_on(i)
        return ranks[0][0] if ranks else None

    def node_event(self, node: str, event: Event) -> None:
        """An event the node's agent reports; a node that is down reports nothing."""
        if self.nodes.down[self.node_pos[node]]:
            self.counters.inc("node_events_unsent_node_down")
            return
        self.node_events[self.node_pos[node]].append(event)

    # -- what faults do ---------------------------------------------------------------------------

    def kill_gpu_process(self, i: int, t: float, fault: int, cause: str) -> None:
        """The process on GPU ``i`` died; a training rank there stays dead until the job restarts."""
        for job, rank in self.training_ranks_on(i):
            if job.alive[rank]:
                job.breakers.add(fault)
                job.kill_rank(rank, t, cause)

    def fault_cleared(self, fault: int) -> None:
        """A fault with a duration ended: jobs it broke restart once nothing else holds them down."""
        for job in self.jobs.values():
            if fault in job.breakers:
                job.breakers.discard(fault)
                blocked = job.running and job.blocked_since is not None
                if not job.breakers and (blocked or job.state == "failed"):
                    self.restarts.append(job.restart)

    def refresh(self, t: float) -> None:
        """Rebuild every condition from the active effects; GPUs and nodes that came back reset."""
        fleet, nodes = self.fleet, self.nodes
        was_gone = fleet.mods.lost | fleet.mods.killed
        was_down = nodes.down.copy()
        fleet.mods = fleet.neutral_mods()
        nodes.reset_mods()
        for job in self.jobs.values():
            job.cond = JobConditions.neutral(job.world)
        for svc in self.services.values():
            svc.cond = ServiceConditions()
        for effect in self.active:
            effect.apply()
        fleet.node_up = np.repeat(~nodes.down, self.per_node)
        for k in np.flatnonzero(was_down & ~nodes.down).tolist():
            nodes.reboot(k)
            for i in range(k * self.per_node, (k + 1) * self.per_node):
                fleet.reset_gpu(i)
        for i in np.flatnonzero(was_gone & ~(fleet.mods.lost | fleet.mods.killed)).tolist():
            fleet.reset_gpu(i)
        for restart in self.restarts:
            restart(t)
        self.restarts.clear()
        for job in self.jobs.values():
            job.sync(t)
