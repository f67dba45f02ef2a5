"""Where the hub's detection side spends its CPU on agent traffic: per batch and per tick, by detector.

The load generator's node batches (bench_hub_cpu.py's traffic: 8 GPUs × the full metric set and a
node frame, about 351 samples, decoded from binary frames with their layout numbers) are fed tick by
tick as the hub's evaluator does: the detection engine observes a tick's batches at once, the
productivity model each batch, then the engine evaluates, the alert engine takes the findings and
the productivity model advances. Every stage and every detector hook is timed in thread CPU
(``time.thread_time_ns``, about 1 µs a call of overhead, included), best of ``--repeats`` passes
over the same ticks, each pass on fresh state; the per-batch figures divide by the batches, the
per-tick ones by the ticks. The first ``WARM`` ticks (the detectors' first sight of each GPU and
layout) are run but not counted.

``--cprofile`` prints the functions under the observe and evaluate stages instead.

usage: python bench/profile_detect.py [--nodes 64] [--ticks 30] [--repeats 3] [--cprofile]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench_hub_stages import Ticks, agent_ticks
from common import console, print_table
from gpuscope.alert.engine import AlertEngine
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.productivity import ProductivityModel

WARM = 3
_HOOKS = ("on_frame", "on_frames", "on_event", "on_training", "evaluate_tick")


def _timed(totals: defaultdict[str, int], label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time_ns()
        try:
            return f(*args, **kwargs)
        finally:
            totals[label] += time.thread_time_ns() - t0

    return timed


class Pass:
    """One pass over the ticks on fresh state; ``totals`` holds the counted ticks' CPU by stage."""

    def __init__(self, hooks: bool) -> None:
        self.totals: defaultdict[str, int] = defaultdict(int)
        self.engine = DetectionEngine()
        self.model = ProductivityModel(2.5)
        self.alerts = AlertEngine()
        self.counting = False
        if hooks:
            for detector in self.engine.detectors:
                name = type(detector).__name__
                for hook in _HOOKS:
                    own = getattr(type(detector), hook, None)
                    if hook != "evaluate_tick" and own is getattr(Detector, hook, None):
                        continue  # the engine skips hooks a detector does not override
                    setattr(detector, hook, self._wrap(f"{name}.{hook}", getattr(detector, hook)))
            table = self.engine.feeds.table
            table.ingest_many = self._wrap("GpuTable.ingest_many", table.ingest_many)  # type: ignore[method-assign]

    def _wrap(self, label: str, f: Callable[..., Any]) -> Callable[..., Any]:
        totals = self.totals
        timed = _timed(totals, label, f)

        @functools.wraps(f)
        def maybe(*args: Any, **kwargs: Any) -> Any:
            return timed(*args, **kwargs) if self.counting else f(*args, **kwargs)

        return maybe

    def run(self, ticks: Ticks) -> None:
        for k, tick in enumerate(ticks):
            self.counting = k >= WARM
            now = max(f.ts for b in tick for f in b.frames) + 0.5
            self._stage("observe: detection", self.engine.observe_many, tick)
            self._stage("observe: productivity", self._productivity, tick)
            findings = self._stage("evaluate: detection", self.engine.evaluate, now)
            self._stage("evaluate: alerts", self.alerts.update, now, findings)
            self._stage("evaluate: productivity", self.model.advance, now, list(self.alerts.firing()))

    def _productivity(self, tick: list[Any]) -> None:
        for batch in tick:
            self.model.observe(batch)

    def _stage(self, label: str, f: Callable[..., Any], *args: Any) -> Any:
        t0 = time.thread_time_ns()
        out = f(*args)
        if self.counting:
            self.totals[label] += time.thread_time_ns() - t0
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="print the hottest functions instead")
    a = ap.parse_args()
    ticks = agent_ticks(a.nodes, a.ticks)
    counted = ticks[WARM:]
    batches = sum(len(t) for t in counted)
    if a.cprofile:
        p = Pass(hooks=False)
        profiler = cProfile.Profile()
        profiler.enable()
        p.run(ticks)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
        return
    stages = Pass(hooks=False)
    best: dict[str, float] = {}
    for _ in range(a.repeats):  # the stages alone, then the hooks within them (the wrappers cost)
        stages = Pass(hooks=False)
        stages.run(ticks)
        for label, ns in stages.totals.items():
            best[label] = min(best.get(label, float("inf")), ns)
    hooks: dict[str, float] = {}
    for _ in range(a.repeats):
        probe = Pass(hooks=True)
        probe.run(ticks)
        for label, ns in probe.totals.items():
            if "." in label:
                hooks[label] = min(hooks.get(label, float("inf")), ns)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = [
        [label, f"{ns / 1e3 / batches:.1f}", f"{ns / 1e3 / len(counted):.0f}"]
        for label, ns in sorted(best.items())
    ]
    rows.append(["all five stages", f"{sum(best.values()) / 1e3 / batches:.1f}", ""])
    print_table(
        f"detection side, {a.nodes} agents, {len(counted)} ticks counted, best of {a.repeats}; load {load}",
        ["stage", "µs/batch", "µs/tick"],
        rows,
    )
    print_table(
        "by detector hook (wrapped: about 1 µs a call added)",
        ["hook", "µs/batch", "µs/tick"],
        [
            [label, f"{ns / 1e3 / batches:.1f}", f"{ns / 1e3 / len(counted):.0f}"]
            for label, ns in sorted(hooks.items(), key=lambda kv: -kv[1])
            if ns / 1e3 / batches >= 0.05
        ],
    )
    console.print(f"{batches} batches, {len(probe.engine.detectors)} detectors")


if __name__ == "__main__":
    main()
