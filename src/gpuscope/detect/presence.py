"""Things that stop reporting: ``gpu_lost`` (a GPU absent while its node reports) and
``node_unreachable`` (a node's agent silent).

A GPU is lost when the driver says so (``gpu_lost`` event) or when its node's frames keep
coming without it (or with an all-empty row: NVML answered nothing) for ``max(2 x period, 2 s)``
of the node's own time; a node that is itself silent proves nothing about its GPUs. It resolves
when the GPU answers again. Nodes are judged by :class:`~gpuscope.detect.liveness.Liveness`:
silence of ``max(4 x period, 4 s)`` on the hub's clock, with hub-wide pauses excused, and
with the fleet's own lateness in event time excused (the hub or the network behind: a node as
recent as the fleet's watermark is not silent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.baseline import IntervalEstimator, finite_or_none
from gpuscope.detect.frames import FrameView, GpuKey, view
from gpuscope.detect.liveness import Liveness
from gpuscope.detect.refusals import event_gpu
from gpuscope.ingest.overload import Wire, node_sender
from gpuscope.model import Event, Finding, Frame
from gpuscope.rules import GPU_LOST, NODE_UNREACHABLE


@dataclass(slots=True)
class _Node:
    last_ts: float = -math.inf
    clock: IntervalEstimator = field(default_factory=IntervalEstimator)
    gpus: dict[str, float] = field(default_factory=dict)  # GPU index -> last time it answered


@register
class GpuLostDetector(Detector):
    rules = (GPU_LOST,)

    def __init__(self, factor: float = 2.0, floor: float = 2.0) -> None:
        self.factor = factor
        self.floor = floor
        self.counters = Counters()
        self._nodes: dict[str, _Node] = {}
        self._events: dict[GpuKey, tuple[float, str]] = {}

    def on_event(self, event: Event) -> None:
        if event.kind != "gpu_lost":
            return
        key = event_gpu(self.counters, event, "gpu_lost_events_without_gpu")
        if key is None:
            return
        node, gpu = key
        reason = event.data.get("reason")
        self._events[(node, gpu)] = (event.ts, reason if isinstance(reason, str) and reason else "lost")

    def reads(self, frame: FrameView) -> bool:
        return bool(frame.nodes)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        ts = frame.ts
        nodes = self._nodes
        for name in v.nodes:
            node = nodes.get(name)
            if node is None:
                node = nodes[name] = _Node()
            node.clock.push(ts)
            if ts > node.last_ts:
                node.last_ts = ts
        alive = v.gpu_alive()
        for i, (name, gpu) in enumerate(v.gpu_keys):
            if alive[i]:
                gpus = nodes[name].gpus
                if gpus.get(gpu, -math.inf) < ts:
                    gpus[gpu] = ts

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        reported: set[GpuKey] = set()
        for key, (ts, reason) in list(self._events.items()):
            node = self._nodes.get(key[0])
            seen = node.gpus.get(key[1], -math.inf) if node is not None else -math.inf
            if seen > ts:
                del self._events[key]  # answered again after the loss
                continue
            reported.add(key)
            out.append(self._finding(key, f"the driver reports it lost ({reason})", ts, now - ts, "event"))
        for name, node in self._nodes.items():
            threshold = max(self.factor * (node.clock.interval or 1.0), self.floor)
            for gpu, seen in node.gpus.items():
                if node.last_ts - seen >= threshold and (name, gpu) not in reported:
                    absent = node.last_ts - seen
                    text = f"absent from the node's reports for {absent:.0f} s while the node keeps reporting"
                    out.append(self._finding((name, gpu), text, seen, absent, "absent"))
        return out

    @staticmethod
    def _finding(key: GpuKey, why: str, since: float, seconds: float, source: str) -> Finding:
        node, gpu = key
        return Finding(
            GPU_LOST,
            {"node": node, "gpu": gpu},
            f"GPU {gpu} on {node} is lost: {why}",
            value=seconds,
            details={"since_ts": since, "source": source},
        )


@register
class NodeUnreachableDetector(Detector):
    rules = (NODE_UNREACHABLE,)

    def __init__(self, factor: float = 4.0, floor: float = 4.0) -> None:
        self.counters = Counters()
        self._live: Liveness[str] = Liveness(factor=factor, floor=floor, min_reports=2)
        self._gpus: dict[str, int] = {}  # most GPUs a node has reported: what its silence idles
        self._suppressed = 0
        self._withheld_watermark = 0
        self._found_on_wire = 0
        self._wire = Wire()

    def reads(self, frame: FrameView) -> bool:
        return bool(frame.nodes)

    def hear_wire(self, wire: Wire) -> None:
        self._wire = wire

    def _off_wire(self, node: str, threshold: float) -> bool:
        return self._wire.dead(node_sender(node), threshold)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        for node in v.nodes:
            self._live.beat(node, frame.ts)
        if len(v.nodes) == 1:
            node = v.nodes[0]
            if len(v.gpu_keys) > self._gpus.get(node, 0):
                self._gpus[node] = len(v.gpu_keys)
        elif v.gpu_keys:
            counts: dict[str, int] = {}
            for node, _ in v.gpu_keys:
                counts[node] = counts.get(node, 0) + 1
            for node, n in counts.items():
                self._gpus[node] = max(self._gpus.get(node, 0), n)

    def on_event(self, event: Event) -> None:
        # a node whose agent stopped cleanly left on purpose: its silence is no outage (until it
        # reports again, which makes it a sender like any other)
        if event.kind == "agent_stopping" and "node" in event.labels:
            self._live.forget(event.labels["node"])

    def replayed(self, now: float) -> None:
        self._live.replayed(now)

    def evaluate(self, now: float) -> list[Finding]:
        out = []
        for late in self._live.overdue(now, self._off_wire):
            node = late.key
            out.append(
                Finding(
                    NODE_UNREACHABLE,
                    {"node": node},
                    f"Node {node} has not reported for {late.silence:.0f} s "
                    f"(threshold {late.threshold:.0f} s from its usual period)",
                    value=late.silence,
                    affected_gpus=max(1, self._gpus.get(node, 0)),
                    details={
                        "silence_seconds": late.silence,
                        "threshold_seconds": late.threshold,
                        "last_report_ts": finite_or_none(late.last_ts),
                        "event_silence_seconds": finite_or_none(late.event_silence),
                        "watermark_lag_seconds": late.watermark_lag,
                    },
                )
            )
        if self._live.suppressed > self._suppressed:
            self.counters.inc("node_verdicts_withheld_hub_gap", self._live.suppressed - self._suppressed)
            self._suppressed = self._live.suppressed
        if self._live.withheld_watermark > self._withheld_watermark:
            self.counters.inc(
                "node_verdicts_withheld_watermark", self._live.withheld_watermark - self._withheld_watermark
            )
            self._withheld_watermark = self._live.withheld_watermark
        if self._live.found_on_wire > self._found_on_wire:
            self.counters.inc("node_verdicts_found_on_wire", self._live.found_on_wire - self._found_on_wire)
            self._found_on_wire = self._live.found_on_wire
        return out

    def stats(self) -> dict[str, float]:
        """How far the fleet's watermark lags the hub's clock, and the largest event-time silence
        among the nodes whose verdict the lag withheld at the latest evaluation."""
        return {
            "watermark_lag_seconds": self._live.watermark_lag,
            "event_silence_seconds": self._live.withheld_event_silence,
        }
