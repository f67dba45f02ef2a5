"""Hub CPU per node batch, stage by stage, on the agents' decoded frames (no HTTP, no disk).

The load generator's node batches (the bench_hub_cpu traffic: 8 GPUs × the full metric set and a
node frame, about 351 samples) are decoded from binary frames, as the ingest route does, and fed
tick by tick to each stage of the hub's path after decode: row preparation (the store), the
detectors' observe and the productivity model's observe. Each stage is timed (thread CPU, best of
``--repeats`` passes over the same ticks, each pass on fresh state) twice in the same run:

- with the frames' layout numbers (``Frame.layout``), so what derives from a sender's metric and
  entity lists alone (entity ids, the detectors' row roles) is looked up, not derived again;
- anchor: the same frames with the numbers removed, so every frame is derived afresh (the path
  before layout numbers, and the path of frames that do not come through the decoder).

Floor, same run: copying each batch's values into a float32 matrix, the least work any columnar
store does per batch.

Garbage collector: the three stages run together over the ticks (prepared batches kept pending for
a commit interval, as the store does), the collector's own CPU per batch (``gc.callbacks``) with
the serving hub's settings (:mod:`gpuscope.gcpolicy`: start-up's objects frozen, young collections
every 20,000 objects) beside CPython's defaults, alternating.

Ingest request (after HTTP parsing): each tick's 64 agents' frames through the ingest route's ASGI
app on a uvloop event loop, spread over 0.2 s, into a hub on a DuckDB store with its ingest log
(decode, validation, row preparation, the log's write and sync, the answer; no commit), process
CPU per request after two ticks of warm-up: the event loop writing and awaiting the log's own sync
(:meth:`Hub.ingest_then`) beside the previous way, a worker thread per request storing and
syncing (what the route does for stores that cannot start an append), alternating.

Last row: a sender's reporting period as the liveness detectors keep it (one gap pushed per tick,
the median read at each evaluation), per sender and tick, with the window kept sorted
(``RollingMedian``) beside the anchor of sorting the window afresh at each read (the code before).

usage: python bench/bench_hub_stages.py [--nodes 64] [--ticks 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from common import console, hub_flush_interval_s, print_table
from gpuscope import gcpolicy
from gpuscope.detect.baseline import RollingMedian, median
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE, decode_frame, encode_frame
from gpuscope.ingest.payload import Limits
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch
from gpuscope.productivity import ProductivityModel
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.prepare import Preparer
from gpuscope.store.registry import ColumnRegistry, EntityRegistry
from gpuscope.web.guard import PRINCIPAL_KEY
from gpuscope.web.ingest_route import IngestRoute

Ticks = list[list[Batch]]
#: ticks of requests before the measured ones: a hub's first requests from new senders register
#: their layouts and entities
WARM_TICKS = 2


def agent_ticks(nodes: int, ticks: int) -> Ticks:
    """Per tick, the agents' node batches as the hub decodes them (each with its layout number)."""
    scenario = build_scenario(FleetShape(nodes=nodes), ticks + 2, faults=[])
    out: Ticks = []
    for tick in Simulator(scenario, t0=1.7e9).ticks():
        out.append([decode_frame(encode_frame(b)) for b in tick.node_batches.values()])
        if len(out) == ticks:
            break
    return out


def without_layouts(ticks: Ticks) -> Ticks:
    """The same batches with fresh frames whose layout is unknown."""
    out: Ticks = []
    for tick in ticks:
        batches = []
        for b in tick:
            frames = [type(f)(f.ts, f.metrics, f.entities, f.values) for f in b.frames]
            batches.append(Batch(b.source, frames, b.events, b.training, b.batch_id))
        out.append(batches)
    return out


def best_us(run: Callable[[Ticks], None], ticks: list[Ticks], repeats: int) -> list[float]:
    """Best thread CPU of ``run`` over all ticks of each variant, per batch, in microseconds; the
    variants alternate, so that a change in the machine's load falls on all of them."""
    batches = sum(len(t) for t in ticks[0])
    best = [float("inf")] * len(ticks)
    for _ in range(repeats):
        for k, variant in enumerate(ticks):
            t0 = time.thread_time()
            run(variant)
            best[k] = min(best[k], time.thread_time() - t0)
    return [b * 1e6 / batches for b in best]


def prepare(ticks: Ticks) -> None:
    entities, columns = EntityRegistry(100_000), ColumnRegistry(512)
    preparer = Preparer(entities, columns, ColumnRegistry(512))
    for k, tick in enumerate(ticks):
        for batch in tick:
            preparer.prepare(batch)
        if k == 0:  # what the writer does after the first commit: ids and columns are stored
            entities.mark_persisted(range(len(entities)))
            columns.mark_persisted(range(len(columns)))


def detect(ticks: Ticks) -> None:
    engine = DetectionEngine()
    for tick in ticks:
        engine.observe_many(tick)


def productivity(ticks: Ticks) -> None:
    model = ProductivityModel(2.5)
    for tick in ticks:
        for batch in tick:
            model.observe(batch)


def floor(ticks: Ticks) -> None:
    for tick in ticks:
        for batch in tick:
            for frame in batch.frames:
                frame.values.astype(np.float32)


def pipeline(ticks: Ticks) -> None:
    """Row preparation, detection and productivity together, each tick's prepared batches kept
    until a commit interval's ticks have passed (what the store holds between commits)."""
    entities, columns = EntityRegistry(100_000), ColumnRegistry(512)
    preparer = Preparer(entities, columns, ColumnRegistry(512))
    engine, model = DetectionEngine(), ProductivityModel(2.5)
    pending: deque[list[object]] = deque(maxlen=max(1, int(hub_flush_interval_s())))
    for k, tick in enumerate(ticks):
        pending.append([preparer.prepare(batch) for batch in tick])
        if k == 0:
            entities.mark_persisted(range(len(entities)))
            columns.mark_persisted(range(len(columns)))
        engine.observe_many(tick)
        for batch in tick:
            model.observe(batch)


def collector_us(ticks: Ticks, repeats: int) -> tuple[float, float, list[int], list[int]]:
    """The collector's CPU per batch while :func:`pipeline` runs, with the serving hub's settings
    and with CPython's defaults (alternating; fewest of ``repeats``), and each one's collections
    per generation in its last pass."""
    spent = [0.0]
    runs = [0, 0, 0]
    started = [0.0]

    def timing(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            spent[0] += time.thread_time() - started[0]
            runs[info["generation"]] += 1

    batches = sum(len(t) for t in ticks)
    defaults = gc.get_threshold()
    best = [float("inf"), float("inf")]
    counts: list[list[int]] = [[], []]
    gc.callbacks.append(timing)
    try:
        for _ in range(repeats):
            for k, tuned in enumerate((True, False)):
                gc.unfreeze()
                gc.set_threshold(*defaults)
                gc.collect()
                if tuned:
                    gcpolicy.tune_for_serving()
                spent[0], runs[:] = 0.0, [0, 0, 0]
                pipeline(ticks)
                best[k] = min(best[k], spent[0])
                counts[k] = list(runs)
    finally:
        gc.callbacks.remove(timing)
        gc.unfreeze()
        gc.set_threshold(*defaults)
    return best[0] * 1e6 / batches, best[1] * 1e6 / batches, counts[0], counts[1]


def context_switches() -> int:
    """Context switches of every thread of this process so far (Linux; 0 elsewhere)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
                total += sum(int(line.split()[-1]) for line in f if "ctxt_switches:" in line)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def requests_us(nodes: int, ticks: int, repeats: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Process CPU per ingest request (see the module docstring) and the process's context
    switches per request: on the event loop, and with a worker thread per request (the previous
    way); fewest of ``repeats`` alternating passes."""
    ticks += WARM_TICKS
    scenario = build_scenario(FleetShape(nodes=nodes), ticks + 2, faults=[])
    now = time.time()
    bodies = []
    for tick in Simulator(scenario, t0=now - ticks - 2).ticks():
        bodies.append([encode_frame(b) for b in tick.node_batches.values()])
        if len(bodies) == ticks:
            break
    headers = [(b"content-type", CONTENT_TYPE.encode())]

    async def one(route: IngestRoute, body: bytes, delay: float) -> None:
        await asyncio.sleep(delay)
        scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": headers}
        scope[PRINCIPAL_KEY] = object()
        chunks = [{"type": "http.request", "body": body}]
        sent: list[Any] = []

        async def receive() -> Any:
            return chunks.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await route(scope, receive, send)
        assert sent[0]["status"] == 200, sent

    async def run(route: IngestRoute, ticks: list[list[bytes]]) -> None:
        for tick in ticks:
            await asyncio.gather(*(one(route, b, 0.2 * k / len(tick)) for k, b in enumerate(tick)))

    best = [float("inf"), float("inf")]
    switches = [float("inf"), float("inf")]
    for _ in range(repeats):
        for k, on_loop in enumerate((True, False)):
            with tempfile.TemporaryDirectory() as tmp:
                hub = Hub(DuckDBStore(str(Path(tmp) / "hub.duckdb"), flush_interval_s=3600))
                if not on_loop:  # the previous way: the route's worker thread stores and syncs
                    hub.ingest_then = lambda batch, durable: False  # type: ignore[method-assign]
                route = IngestRoute(hub, Limits(), clock=lambda: now)
                uvloop.run(run(route, bodies[:WARM_TICKS]))  # new senders, layouts, entities
                t0, s0 = time.process_time(), context_switches()
                uvloop.run(run(route, bodies[WARM_TICKS:]))
                best[k] = min(best[k], time.process_time() - t0)
                switches[k] = min(switches[k], context_switches() - s0)
                hub.store.close()
    requests = sum(len(t) for t in bodies[WARM_TICKS:])
    cpu = (best[0] * 1e6 / requests, best[1] * 1e6 / requests)
    return cpu, (switches[0] / requests, switches[1] / requests)


def intervals_us(senders: int, ticks: int, repeats: int) -> tuple[float, float]:
    """Per sender and tick: push a jittered gap, read the median (kept sorted; sorted afresh)."""
    gaps = (1.0 + np.random.default_rng(1).normal(0, 0.01, (ticks, senders))).tolist()
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        t0 = time.thread_time()
        kept = [RollingMedian(15) for _ in range(senders)]
        for row in gaps:
            for window, gap in zip(kept, row, strict=True):
                window.push(gap)
                window.median()
        best[0] = min(best[0], time.thread_time() - t0)
        t0 = time.thread_time()
        plain = [deque[float](maxlen=15) for _ in range(senders)]
        for row in gaps:
            for buf, gap in zip(plain, row, strict=True):
                buf.append(gap)
                median(list(buf))
        best[1] = min(best[1], time.thread_time() - t0)
    return best[0] * 1e6 / (senders * ticks), best[1] * 1e6 / (senders * ticks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    console.print(f"{a.ticks} ticks of {a.nodes} agents' decoded batches, best of {a.repeats}")
    ticks = agent_ticks(a.nodes, a.ticks)
    plain = without_layouts(ticks)
    rows = []
    total = [0.0, 0.0]
    stages = (("row preparation", prepare), ("detectors observe", detect), ("productivity", productivity))
    for name, run in stages:
        with_, without = best_us(run, [ticks, plain], a.repeats)
        total[0] += with_
        total[1] += without
        rows.append([name, f"{with_:.1f}", f"{without:.1f}", f"{without - with_:+.1f}"])
    rows.append(["all three", f"{total[0]:.1f}", f"{total[1]:.1f}", f"{total[1] - total[0]:+.1f}"])
    rows.append(["floor: values copied to float32", f"{best_us(floor, [ticks], a.repeats)[0]:.1f}", "", ""])
    tuned, default, runs_tuned, runs_default = collector_us(ticks, a.repeats)
    rows.append(
        [
            "garbage collector during the three (collections by generation)",
            f"{tuned:.1f} ({'/'.join(map(str, runs_tuned))})",
            f"{default:.1f} ({'/'.join(map(str, runs_default))}; CPython's defaults)",
            f"{default - tuned:+.1f}",
        ]
    )
    (loop_us, worker_us), (loop_cs, worker_cs) = requests_us(a.nodes, min(a.ticks, 10), a.repeats)
    rows.append(
        [
            "ingest request: decode, prepare, log write + sync, answer (context switches)",
            f"{loop_us:.1f} ({loop_cs:.1f}; event loop)",
            f"{worker_us:.1f} ({worker_cs:.1f}; a worker thread per request)",
            f"{worker_us - loop_us:+.1f}",
        ]
    )
    kept, afresh = intervals_us(a.nodes, 10 * a.ticks, a.repeats)
    rows.append(["a sender's period: push + median", f"{kept:.2f}", f"{afresh:.2f}", f"{afresh - kept:+.2f}"])
    load = os.getloadavg()
    print_table(
        f"hub CPU per node batch by stage, µs ({a.nodes} agents; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
        ["stage", "this code", "anchor: the previous way (see above)", "saved"],
        rows,
    )


if __name__ == "__main__":
    main()
