"""The simulator: turns a scenario into the batches real agents and SDKs would send, tick by tick.

Each tick covers ``(t - interval, t]`` of simulated time. Instants inside it (a job starting, a
fault beginning or ending) are applied at their exact time, with the workloads advanced up to
that moment first, so events carry their true timestamps. Then the GPUs, hosts and services are
sampled at ``t`` and packed per the signal contract: one batch per node that is up (GPU frame,
node frame, service frame, driver events) and one SDK batch per job or service with news.
Timestamps are ``t0 + t``; everything is deterministic for a scenario's seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gpuscope.counters import Counters
from gpuscope.model import Batch, Event, Frame, Labels, TrainingRecord
from gpuscope.sim.faults import Effect, make_effect
from gpuscope.sim.gpus import GPU_COLUMNS
from gpuscope.sim.inference import SERVICE_COLUMNS, InferenceService
from gpuscope.sim.nodes import NODE_COLUMNS
from gpuscope.sim.scenario import FaultSpec, Scenario
from gpuscope.sim.training import TrainingJob
from gpuscope.sim.truth import GroundTruth
from gpuscope.sim.world import World

# order of instants that fall on the same time: starts, then fault ends, fault onsets, job ends
_JOB_START, _FAULT_END, _FAULT_BEGIN, _JOB_END = range(4)


@dataclass(slots=True)
class Tick:
    """What every sender delivers for the interval ending at ``t`` (seconds from scenario start)."""

    t: float
    node_batches: dict[str, Batch]
    sdk_batches: list[Batch]
    #: ground truth for displays: the faults that began or ended within this interval
    faults_started: tuple[FaultSpec, ...] = ()
    faults_ended: tuple[FaultSpec, ...] = ()


@dataclass(slots=True, order=True)
class _Instant:
    t: float
    order: int
    seq: int
    what: TrainingJob | InferenceService | FaultSpec


class Simulator:
    """Runs a scenario; iterate :meth:`ticks` for the batches of every sampling interval."""

    def __init__(self, scenario: Scenario, t0: float = 0.0) -> None:
        self.scenario = scenario
        self.t0 = t0
        self.world = World(scenario)
        w = self.world
        self._workloads: list[TrainingJob | InferenceService] = [*w.jobs.values(), *w.services.values()]
        instants: list[_Instant] = []
        for seq, job in enumerate(self._workloads):
            instants.append(_Instant(job.spec.start, _JOB_START, seq, job))
            if job.spec.end <= scenario.duration:
                instants.append(_Instant(job.spec.end, _JOB_END, seq, job))
        for f in scenario.faults:
            instants.append(_Instant(f.at, _FAULT_BEGIN, f.index, f))
            if f.end <= scenario.duration:
                instants.append(_Instant(f.end, _FAULT_END, f.index, f))
        self._instants = sorted(instants)
        self._next = 0
        self._effects: dict[int, Effect] = {}
        #: what every GPU truly did, interval by interval (the productivity model's ground truth)
        self.truth = GroundTruth()
        self._gpu_labels: list[Labels] = [
            {"node": w.fleet.node_of[i], "gpu": str(i % w.per_node), "uuid": w.fleet.uuids[i]}
            for i in range(w.fleet.n)
        ]

    @property
    def counters(self) -> Counters:
        """What the simulator could not deliver (e.g. events of a node that was down)."""
        return self.world.counters

    def ticks(self) -> Iterator[Tick]:
        s = self.scenario
        n = math.floor(s.duration / s.interval + 1e-9)
        for k in range(1, n + 1):
            yield self._tick(k * s.interval, s.interval)

    def stop(self, t: float) -> list[Batch]:
        """The run is cut short at ``t`` (seconds from scenario start): every job and service still
        running ends there, as its SDK's ``finish()`` would say, and the SDK batches carrying those
        ends are returned. A hub told nothing would take the ranks that fell silent for lost ones,
        then and whenever it reopens the run's store."""
        for workload in self._workloads:
            workload.end(t)
        return self._sdk_batches(self.t0 + t, ":stop")  # not the id of the tick at t (deduplicated)

    # -- one tick ---------------------------------------------------------------------------------

    def _tick(self, t: float, dt: float) -> Tick:
        w = self.world
        started: list[FaultSpec] = []
        ended: list[FaultSpec] = []
        while self._next < len(self._instants) and self._instants[self._next].t <= t:
            inst = self._instants[self._next]
            self._next += 1
            for job in w.jobs.values():
                job.advance(inst.t)
            self._apply(inst, started, ended)
            w.refresh(inst.t)
        for job in w.jobs.values():
            job.advance(t)
        for effect in w.active:
            effect.advance(t)

        demand = w.fleet.reset_demand()
        w.nodes.reset_demand()
        for job in w.jobs.values():
            job.fill_demand(demand)
        up = {name for k, name in enumerate(w.node_names) if not w.nodes.down[k]}
        service_rows: dict[str, list[tuple[Labels, np.ndarray]]] = {}
        for svc in w.services.values():
            for node, labels, row in svc.sample(t, dt, demand, up):
                service_rows.setdefault(node, []).append((labels, row))
        gpu_values = w.fleet.sample(dt)
        self.truth.record(w, dt)
        node_values = w.nodes.sample(dt)
        ts = self.t0 + t
        return Tick(
            t=t,
            node_batches=self._node_batches(ts, gpu_values, node_values, demand.jobs, service_rows),
            sdk_batches=self._sdk_batches(ts),
            faults_started=tuple(started),
            faults_ended=tuple(ended),
        )

    def _apply(self, inst: _Instant, started: list[FaultSpec], ended: list[FaultSpec]) -> None:
        what, t = inst.what, inst.t
        if isinstance(what, FaultSpec):
            if inst.order == _FAULT_BEGIN:
                effect = make_effect(what, self.world)
                self._effects[what.index] = effect
                effect.begin(t)
                self.world.active.append(effect)
                started.append(what)
            else:
                effect = self._effects.pop(what.index)
                self.world.active.remove(effect)
                effect.finish(t)
                ended.append(what)
        elif inst.order == _JOB_START:
            what.start(t)
        else:
            what.end(t)

    def _node_batches(
        self,
        ts: float,
        gpu_values: np.ndarray,
        node_values: np.ndarray,
        jobs: list[str | None],
        service_rows: dict[str, list[tuple[Labels, np.ndarray]]],
    ) -> dict[str, Batch]:
        w = self.world
        per = w.per_node
        lost = w.fleet.mods.lost
        out: dict[str, Batch] = {}
        for k, node in enumerate(w.node_names):
            events = w.node_events[k]
            w.node_events[k] = []
            if w.nodes.down[k]:
                continue
            lo = k * per
            rows = [i for i in range(lo, lo + per) if not lost[i]]
            entities: list[Labels] = []
            for i in rows:
                labels = dict(self._gpu_labels[i])
                job = jobs[i]
                if job is not None:
                    labels["job"] = job
                entities.append(labels)
            values = gpu_values[lo : lo + per] if len(rows) == per else gpu_values[rows]
            frames = [
                Frame(ts, list(GPU_COLUMNS), entities, values),
                Frame(ts, list(NODE_COLUMNS), [{"node": node}], node_values[k : k + 1]),
            ]
            svc = service_rows.get(node)
            if svc:
                frames.append(
                    Frame(ts, list(SERVICE_COLUMNS), [lab for lab, _ in svc], np.vstack([r for _, r in svc]))
                )
            _shift(events, [], self.t0)
            out[node] = Batch(source=node, frames=frames, events=events, batch_id=f"{node}:{ts:.3f}")
        return out

    def _sdk_batches(self, ts: float, tag: str = "") -> list[Batch]:
        out: list[Batch] = []
        for job in self._workloads:
            records = job.records if isinstance(job, TrainingJob) else []
            frames = job.frames if isinstance(job, InferenceService) else []
            if not job.events and not records and not frames:
                continue
            _shift(job.events, records, self.t0)
            for f in frames:
                f.ts += self.t0
            source = f"sdk:{job.spec.name}"
            out.append(
                Batch(
                    source=source,
                    frames=frames,
                    events=job.events,
                    training=records,
                    batch_id=f"{source}:{ts:.3f}{tag}",
                )
            )
            job.events = []
            if isinstance(job, TrainingJob):
                job.records = []
            else:
                job.frames = []
        return out


def _shift(events: list[Event], records: list[TrainingRecord], t0: float) -> None:
    """Move simulated-time stamps to the caller's clock."""
    if t0:
        for e in events:
            e.ts += t0
        for r in records:
            r.ts += t0
