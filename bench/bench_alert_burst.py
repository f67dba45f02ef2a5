"""An outage on an in-process hub: N of M nodes go silent at once and N ``node_unreachable`` fire.

What it measures, in virtual time (each tick is ingested, then evaluated, back to back):
- the evaluator's stall: the wall time of the evaluation that fires the burst (the hub evaluates
  nothing else meanwhile), and of the evaluations after it; beside it the evaluator thread's own
  CPU and the other threads' (triage, DuckDB's) in the same span: wall above the sum is time the
  process waited for a core;
- CPU per alert fired: process CPU from the burst's evaluation until every alert was triaged,
  saved and dispatched (``AlertingService.drain``), less one quiet tick's, over N; the part
  spent in the evaluator's own thread is shown beside it;
- how long until the last of them reached the outbox.
Anchor, same run: the evaluation tick's own cost (ingest excluded) with no alert firing, on the
same live nodes, measured on the ticks just before the burst.

Run it against an earlier commit the same way (``PYTHONPATH=<that tree>/src``) for before/after:
the synchronous service of earlier commits has no ``drain``, it dispatched inside the evaluation.

usage: python bench/bench_alert_burst.py [--nodes 384] [--silent 60] [--gpus 8] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common import TELEMETRY, Fleet, print_table, telemetry_ticks
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore

WARM_TICKS = 20  # every node reports
QUIET_TICKS = 3  # the silent nodes are quiet but not yet overdue (4 s): the anchor's ticks
AFTER_TICKS = 6  # evaluations after the burst


def node_batches(fleet: Fleet, ts: float, names: list[str], values: np.ndarray) -> list[Batch]:
    """One agent request per node: its GPUs' row of the tick."""
    gpus = fleet.gpus_per_node
    out = []
    for n in range(fleet.nodes):
        entities = [{"node": f"node-{n}", "gpu": str(g), "job": f"job-{n // 16}"} for g in range(gpus)]
        frame = Frame(ts, names, entities, values[n * gpus : (n + 1) * gpus].copy())
        out.append(Batch(f"node-{n}", frames=[frame], batch_id=f"node-{n}-{ts:.0f}"))
    return out


def drainer(service: AlertingService) -> Callable[[], None]:
    drain = getattr(service, "drain", None)  # absent before triage left the evaluator's thread
    if drain is None:
        return lambda: None
    return lambda: None if drain(60.0) else print("drain timed out")


def run(nodes: int, silent: int, gpus: int, profile: bool) -> dict[str, float]:
    fleet = Fleet(nodes, gpus)
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store)
    cfg = {
        # port 9 (discard): nothing delivers in this bench, the outbox only queues
        "receivers": [{"name": "hook", "webhook": {"url": "http://127.0.0.1:9/hook"}}],
        "routes": [{"receiver": "hook", "group_by": ["alertname", "node"], "group_wait": "0s"}],
    }
    service = AlertingService(hub, parse_alerting(cfg))
    service.start()
    service.outbox.stop()  # queued, not delivered: delivery is not what is measured
    drain = drainer(service)
    t0 = float(int(time.time())) - 200
    ticks = list(telemetry_ticks(fleet, WARM_TICKS + QUIET_TICKS + 2 + AFTER_TICKS, t0=t0))
    quiet_cpu: list[float] = []
    after_wall: list[float] = []
    result: dict[str, float] = {}
    profiler = cProfile.Profile() if profile else None
    try:
        for k, (ts, names, values) in enumerate(ticks):
            batches = node_batches(fleet, ts, names, values)
            if k >= WARM_TICKS:
                batches = batches[silent:]  # nodes 0 .. silent-1 went quiet
            for batch in batches:
                hub.ingest(batch)
            hub.settle()  # ingest's observe stage, outside what is measured
            store.events(ts, ts, "none")  # and its commit, which the store leaves to the next read
            cpu, thread, wall = time.process_time(), time.thread_time(), time.perf_counter()
            if profiler is not None and k >= WARM_TICKS:
                profiler.enable()
            changes = hub.evaluate(ts)
            evaluated = time.perf_counter()
            evaluator_cpu = time.thread_time() - thread
            others_cpu = time.process_time() - cpu - evaluator_cpu  # other threads, meanwhile
            fired = sum(c.kind == "fired" for c in changes)
            drain()
            if profiler is not None:
                profiler.disable()
            spent = time.process_time() - cpu
            if k >= WARM_TICKS and not hub.firing():
                quiet_cpu.append(spent)
            elif fired:
                result = {
                    "alerts": float(fired),
                    "stall_s": evaluated - wall,
                    "stall_cpu_s": evaluator_cpu,
                    "stall_others_cpu_s": others_cpu,
                    "burst_cpu_s": spent,
                    "evaluator_cpu_s": evaluator_cpu,
                    "dispatched_after_s": time.perf_counter() - wall,
                }
            elif result:
                after_wall.append(evaluated - wall)
    finally:
        service.stop()
        store.close()
    if not result or not quiet_cpu:
        raise SystemExit(f"no burst: {len(hub.firing())} alerts firing at the end")
    anchor = statistics.median(quiet_cpu)
    result["anchor_tick_cpu_s"] = anchor
    result["after_max_s"] = max(after_wall, default=0.0)
    result["us_per_alert"] = 1e6 * (result["burst_cpu_s"] - anchor) / result["alerts"]
    result["evaluator_us_per_alert"] = 1e6 * (result["evaluator_cpu_s"] - anchor) / result["alerts"]
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=384)
    parser.add_argument("--silent", type=int, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="cProfile the burst (evaluator thread)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not 0 < args.silent < args.nodes or len(TELEMETRY) == 0:
        raise SystemExit("need 0 < --silent < --nodes")
    r = run(args.nodes, args.silent, args.gpus, args.profile)
    ms = 1000.0
    print_table(
        f"{args.silent} of {args.nodes} nodes ({args.gpus} GPUs each) silent at once: "
        f"{r['alerts']:.0f} alerts fired",
        ["figure", "value"],
        [
            ["anchor: one evaluation tick, no alert firing (CPU ms)", f"{r['anchor_tick_cpu_s'] * ms:.1f}"],
            ["evaluator stall: the burst's evaluation (wall ms)", f"{r['stall_s'] * ms:.1f}"],
            [
                "  its thread's CPU / other threads' CPU meanwhile (ms)",
                f"{r['stall_cpu_s'] * ms:.1f} / {r['stall_others_cpu_s'] * ms:.1f}",
            ],
            ["evaluations after the burst: slowest (wall ms)", f"{r['after_max_s'] * ms:.1f}"],
            ["last alert in the outbox after (wall ms)", f"{r['dispatched_after_s'] * ms:.1f}"],
            ["CPU per alert fired, all-in (µs)", f"{r['us_per_alert']:.0f}"],
            ["  of which in the evaluator's thread (µs)", f"{r['evaluator_us_per_alert']:.0f}"],
        ],
    )
    if args.json:
        args.json.write_text(json.dumps(r))


if __name__ == "__main__":
    main()
