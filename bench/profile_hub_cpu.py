"""Where a served hub's CPU goes per node batch: by thread, and by stage within each thread.

A real ``gpuscope hub`` process fed bench_hub_cpu.py's traffic (the agents' node batches as binary
frames, one POST per node per second spread over the second, ``--agents`` connections), started
through this file (``--serve``), which puts thread-CPU accumulators (``time.thread_time_ns``)
around the stages of an agent's request (uvicorn's HTTP parsing and task start, the frame decode,
the batch-id claim, row preparation, the log record's encoding and write, the answer's write) and
of the other threads (the log's sync, the observe stage's observers and the evaluation, the DuckDB
commit), and counts the garbage collector's time (``gc.callbacks``). Over the measured window
(bench_hub_cpu.py's: after the warm-up ticks, whole commit intervals, before the tail) the hub
reports each thread's CPU from ``/proc/self/task`` and each stage's, per acknowledged batch.

The stages are inclusive (a stage's figure holds the stages it calls: the request's "store
append" holds the claim, preparation, encoding and write), and each costs about 1-2 µs a call in
clock reads, which the figures include. What no stage holds on the event loop is uvicorn's and
uvloop's own work between them (reading the socket, the ASGI layers, the task's steps, the keep-alive
timers, the response's headers) and the kernel's for those system calls.

Anchor, same run: the hub process's CPU per batch (psutil, all threads), as bench_hub_cpu.py
measures it (here with the accumulators' cost in it).

usage: python bench/profile_hub_cpu.py [--nodes 64] [--ticks 20] [--agents 32]
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

import bench_hub_cpu as cpu
from common import console, gpuscope_hub, print_table
from gpuscope.cli import main as gpuscope
from gpuscope.observing import ObserveStage

#: (module, owner in it or "" for the module itself, attribute, stage label, thread it runs on)
STAGES = [
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol", "data_received", "HTTP parse, task start"),
    ("gpuscope.web.lean_ingest", "LeanRequest", "start", "lean path: auth, admission, decode, append"),
    ("gpuscope.web.http_protocol", "JoinedWrites", "flush", "answer's write (send)"),
    ("gpuscope.web.ingest_route", "IngestRoute", "_decode", "decode + time window"),
    ("gpuscope.hub", "Hub", "ingest_then", "store append (all below)"),
    ("gpuscope.store.batch_ids", "BatchIds", "claim", "  batch-id claim"),
    ("gpuscope.store.prepare", "Preparer", "prepare", "  row preparation"),
    ("gpuscope.store.duckdb.store", "", "encode", "  log record encoding"),
    ("gpuscope.store.ingest_log", "IngestLog", "write", "  log write"),
    ("gpuscope.store.ingest_log", "IngestLog", "when_synced", "  awaiting the sync"),
    ("gpuscope.web.ingest_route", "IngestRoute", "_durable", "answer's wake-up"),
    ("gpuscope.store.ingest_log", "IngestLog", "_sync", "log sync (fdatasync)"),
    ("gpuscope.store.ingest_log", "IngestLog", "_fire", "durable callbacks"),
    ("gpuscope.hub", "Hub", "evaluate", "evaluation (all below)"),
    ("gpuscope.hub", "Hub", "settle", "  observe stage"),
    ("gpuscope.detect.engine", "DetectionEngine", "evaluate", "  detectors' evaluate"),
    ("gpuscope.store.duckdb.store", "DuckDBStore", "_flush", "DuckDB commit"),
]

#: (thread name, stage) -> [thread-CPU ns, calls]
_totals: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])


def _count(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def counted(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time_ns()
        try:
            return f(*args, **kwargs)
        finally:
            entry = _totals[(threading.current_thread().name, label)]
            entry[0] += time.thread_time_ns() - t0
            entry[1] += 1

    return counted


def _observers() -> None:
    """Each observer of the observe stage (detection, productivity, ...) as its own stage."""
    run = ObserveStage._run

    def counted(self: ObserveStage, name: str, observer: Any, batches: list[Any]) -> None:
        _count(f"    observer {name}", run)(self, name, observer, batches)

    ObserveStage._run = counted  # type: ignore[method-assign]


def _threads() -> dict[int, tuple[float, int, int]]:
    """Per thread id: CPU seconds, voluntary and involuntary context switches."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = {k: int(v) for k, v in (line.split(":") for line in status.splitlines() if "ctxt" in line)}
        out[int(tid)] = (
            (int(fields[11]) + int(fields[12])) / tick,
            switches["voluntary_ctxt_switches"],
            switches["nonvoluntary_ctxt_switches"],
        )
    return out


def serve(report: str, argv: list[str]) -> int:
    """The hub (``gpuscope`` ``argv``) with the accumulators; SIGUSR1 starts the window, SIGUSR2
    writes ``report``."""
    for module, owner, attr, label in STAGES:
        target: Any = importlib.import_module(module)
        if owner:
            target = getattr(target, owner)
        setattr(target, attr, _count(label, getattr(target, attr)))
    _observers()
    started: dict[int, float] = {}

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[threading.get_ident()] = time.thread_time_ns()
            return
        entry = _totals[(threading.current_thread().name, f"garbage collector (gen {info['generation']})")]
        entry[0] += time.thread_time_ns() - started.pop(threading.get_ident(), time.thread_time_ns())
        entry[1] += 1

    gc.callbacks.append(collected)
    window: dict[int, tuple[float, int, int]] = {}

    def start(_sig: int, _frame: FrameType | None) -> None:
        _totals.clear()
        window.clear()
        window.update(_threads())

    def stop(_sig: int, _frame: FrameType | None) -> None:
        now = _threads()
        names = {t.native_id: t.name for t in threading.enumerate()}
        threads = {
            names.get(tid, f"thread {tid} (not Python's: DuckDB, ...)"): [
                a - b for a, b in zip(v, window.get(tid, (0, 0, 0)), strict=True)
            ]
            for tid, v in now.items()
        }
        stages = [[th, label, ns, n] for (th, label), (ns, n) in _totals.items()]
        Path(report).write_text(json.dumps({"threads": threads, "stages": stages}))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    return gpuscope(argv)


def profile(nodes: int, n_ticks: int, agents: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        entry = [__file__, "--serve", str(report), "--"]
        with gpuscope_hub(Path(tmp) / "hub.duckdb", ready_s=cpu.HUB_START_S, entry=entry) as (url, proc):
            ticks = cpu.node_ticks(nodes, n_ticks)
            hub = psutil.Process(proc.pid)
            marks = iter([signal.SIGUSR1, signal.SIGUSR2])

            def process_cpu() -> float:
                times = hub.cpu_times()
                proc.send_signal(next(marks))
                return float(times.user + times.system)

            used, batches, _ = cpu.post_node_ticks(url, ticks, agents, process_cpu)
            deadline = time.monotonic() + 30
            while not report.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            doc = json.loads(report.read_text())
    load = os.getloadavg()
    rows = [
        [name, f"{cpu_s * 1e3 / batches:.3f}", f"{vol / batches:.2f} + {inv / batches:.2f}"]
        for name, (cpu_s, vol, inv) in sorted(doc["threads"].items(), key=lambda kv: -kv[1][0])
        if cpu_s > 0
    ]
    rows.append(["all (psutil, the anchor)", f"{used * 1e3 / batches:.3f}", ""])
    loads = " ".join(f"{x:.1f}" for x in load)
    print_table(
        f"hub CPU per batch by thread ({batches:,} batches; load average {loads})",
        ["thread", "CPU ms/batch", "context switches/batch (voluntary + involuntary)"],
        rows,
    )
    order = {label: float(i) for i, (_, _, _, label) in enumerate(STAGES)}
    observers = order["  observe stage"] + 0.5  # each observer under the stage that runs them
    stages = sorted(doc["stages"], key=lambda s: (s[0], order.get(s[1], observers), s[1]))
    print_table(
        "hub CPU per batch by stage (inclusive: an indented stage is part of the one above it)",
        ["thread", "stage", "µs/batch", "calls/batch"],
        [[th, label, f"{ns / 1e3 / batches:.1f}", f"{n / batches:.2f}"] for th, label, ns, n in stages],
    )
    console.print("the accumulators cost about 1-2 µs a call; the thread figures include them")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":  # the hub process this script starts
        sys.exit(serve(sys.argv[2], sys.argv[4:]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--agents", type=int, default=32, help="concurrent connections")
    a = ap.parse_args()
    profile(a.nodes, a.ticks, a.agents)


if __name__ == "__main__":
    main()
