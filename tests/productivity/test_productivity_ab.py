"""A/B: the productivity model's cheaper GPU-frame path counts every GPU-second as the old one did.

The old path is kept here (``observe`` and ``_gpu_frame`` before the changes, verbatim): it asked
the holders of every GPU row twice, noted its node's last report once per row, and found each
metric's column by a scan of the frame's metric list (now kept per frame layout). Both models see the same
simulated cluster (training, a service, a lost GPU, a node going down, a thermal fault) and, in a
second run, allocation rows (pods holding GPUs, with teams) as the kubelet collector reports them;
the agents' batches in process and through the binary wire format (frames with layout numbers, as
a hub decodes them); at every tick the GPU states and the GPU time by fleet, node, job, team and
service must be equal.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.model import Batch, Frame
from gpuscope.productivity import ProductivityModel
from gpuscope.productivity.model import _THROTTLE_FLAGS, GpuView
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import parse_scenario

SCENARIO = """
name: ab-productivity
seed: 5
duration: 600
interval: 1
cluster: {nodes: 4, gpus_per_node: 8, gpu_model: H100-SXM5-80GB, price_per_gpu_hour: 2.5}
jobs:
  - {name: pretrain, kind: training, nodes: [node-0, node-1], step_time: 1.2, checkpoint_every: 300}
  - {name: chat-api, kind: inference, nodes: [node-3], gpus: [0, 1, 2, 3], rps: 40, model: chat, version: v7}
faults:
  - {at: 100, kind: thermal_throttle, target: {node: node-1, gpu: 4}, params: {temp: 90}, duration: 200}
  - {at: 200, kind: training_hang, target: {job: pretrain}, duration: 120}
  - {at: 350, kind: gpu_lost, target: {node: node-3, gpu: 5}}
  - {at: 450, kind: node_down, target: {node: node-1}}
"""


class OldModel(ProductivityModel):
    """The productivity model before the changes: holders asked per row, the node noted per row,
    each column found by a scan of the metric list."""

    def observe(self, batch: Batch) -> None:
        with self._lock:
            for event in batch.events:
                job = event.labels.get("job")
                if job is not None:
                    self._job(job).on_event(event)
                elif event.kind == "agent_stopping":  # the node left on purpose: not down, gone
                    node = event.labels.get("node")
                    self.gpus = {k: v for k, v in self.gpus.items() if v.node != node}
            for record in batch.training:
                self._job(record.job).on_record(record)
            for frame in batch.frames:
                if frame.column("gpu_utilization_percent") is not None:
                    self._gpu_frame(frame)
                elif (held := frame.column("slurm_node_unavailable")) is not None:
                    self._scheduler_frame(frame, held)
                elif (owned := frame.column("gpu_owner_allocated")) is not None:
                    self.holders.observe(frame, owned)
                elif frame.entities and "service" in frame.entities[0]:
                    self.services.update(e["service"] for e in frame.entities if "service" in e)

    def _gpu_frame(self, frame: Frame) -> None:
        ts = frame.ts
        column = frame.column("gpu_utilization_percent")
        assert column is not None
        util: list[float] = column.tolist()
        throttled = np.zeros(len(util), bool)
        for flag in _THROTTLE_FLAGS:
            if (c := frame.column(flag)) is not None:
                throttled |= c > 0
        is_throttled: list[bool] = throttled.tolist()
        clock_column = frame.column("gpu_sm_clock_mhz")
        clocks: list[float] | None = None if clock_column is None else clock_column.tolist()
        for i, labels in enumerate(frame.entities):
            node, gpu = labels.get("node"), labels.get("gpu")
            if node is None or gpu is None:
                continue
            self.node_seen[node] = max(self.node_seen.get(node, -math.inf), ts)
            key = (node, gpu)
            view = self.gpus.get(key)
            if view is None:
                view = self.gpus[key] = GpuView(node, gpu, accounted=ts, last_seen=ts)
                continue
            if ts <= view.accounted:
                continue
            if ts > view.last_seen:
                view.interval = 0.8 * view.interval + 0.2 * min(ts - view.last_seen, 60.0)
                view.last_seen = ts
            view.job = labels.get("job", "")
            view.held = self.holders.held(node, gpu, ts)
            view.team = labels.get("team") or self.holders.team(node, gpu, labels.get("pod", ""), ts)
            view.throttled = is_throttled[i]
            busy = util[i]
            job = self.jobs.get(view.job) if view.job else None
            if job is not None and clocks is not None:
                clock = clocks[i]
                if busy >= 50.0 and math.isfinite(clock) and clock > 0:
                    view.clock_max = max(view.clock_max, clock)
                else:
                    clock = view.clock_max
                job.clocks[key] = (clock, view.clock_max)
            cause, lost = self._classify(view, busy, ts)
            if job is not None and cause != view.cause:
                self._recount(view, job, cause)
            self._count(view, view.accounted, ts, cause, lost)


def _holdings(ts: float) -> Batch:
    """node-2's GPUs held by pods of two teams (no job label on their GPU rows: idle allocations)."""
    entities = [
        {"node": "node-2", "gpu": str(g), "pod": f"ml/p{g % 3}", "team": "vision" if g % 2 else "nlp"}
        for g in range(6)
    ]
    entities.append({"node": "node-2", "gpu": "7", "pod": "ml/p9"})
    frame = Frame(ts, ["gpu_owner_allocated"], entities, np.ones((len(entities), 1)))
    return Batch(source="kubelet:node-2", frames=[frame])


def _same(old: ProductivityModel, new: ProductivityModel, now: float) -> None:
    assert new.gpu_states() == old.gpu_states()
    assert new.node_seen == old.node_seen
    for by in ("fleet", "node", "job", "team", "service"):
        assert new.summary(by, 0.0, now) == old.summary(by, 0.0, now), by
    assert new.ledger.unsaved() == old.ledger.unsaved()
    # what a GPU's frame said of it besides its state: its throttle flags and its full clock
    assert {k: (v.throttled, v.clock_max) for k, v in new.gpus.items()} == {
        k: (v.throttled, v.clock_max) for k, v in old.gpus.items()
    }


@pytest.mark.parametrize(
    ("allocations", "wire"),
    [(False, False), (True, False), (False, True)],
    ids=["agents-only", "with-allocations", "decoded-frames"],
)
def test_same_gpu_time_as_the_old_gpu_frame_path(allocations: bool, wire: bool) -> None:
    old, new = OldModel(2.5), ProductivityModel(2.5)
    states: set[str] = set()
    throttled = False
    for tick in Simulator(parse_scenario(SCENARIO), t0=1.7e9).ticks():
        nodes = list(tick.node_batches.values())
        batches = [*([decode_frame(encode_frame(b)) for b in nodes] if wire else nodes), *tick.sdk_batches]
        ts = max(f.ts for b in tick.node_batches.values() for f in b.frames)
        if allocations and int(ts) % 30 == 0:
            batches.append(_holdings(ts))
        for model in (old, new):
            for batch in batches:
                model.observe(batch)
            model.advance(ts + 0.5, [])
        _same(old, new, ts + 1)
        states.update(s["cause"] for s in new.gpu_states())
        throttled = throttled or any(v.throttled for v in new.gpus.values())
    # the run went through the states a user reads on the page, not only healthy training
    assert {"training", "lost_gpu", "node_unreachable"} <= states
    assert throttled  # the thermal fault's flags reached the model
    if allocations:
        # the held GPUs' time went to the pods' teams: the holders' path ran
        assert {"vision", "nlp"} <= {g["group"] for g in new.summary("team", 0.0, 2e9)["groups"]}
