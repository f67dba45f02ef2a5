"""The lean ingest path against the ASGI path: hub CPU per node batch, event loop and process.

A real ``gpuscope hub`` process fed bench_hub_cpu.py's traffic (the agents' node batches as binary
frames, one POST per node per second spread over the second, ``--agents`` connections), started
through this file (``--serve lean|asgi``) so that agents' batches are served either from the HTTP
parser's callbacks (:mod:`gpuscope.web.lean_ingest`, what a hub does) or down uvicorn's ASGI path
(the hub before it). Runs alternate (asgi, lean, asgi, lean, ...) so that both see the same load
on a shared machine; each row gives the load average beside its figures.

Figures, over bench_hub_cpu.py's measured window, per acknowledged batch: the event loop's CPU
(the hub's main thread, which serves HTTP) and the whole process's (psutil, all threads: the
ingest log's sync, the detectors, DuckDB's commits too).

usage: python bench/bench_lean_ingest.py [--pairs 3] [--nodes 64] [--ticks 20] [--agents 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

import bench_hub_cpu as cpu
from common import console, gpuscope_hub, print_table
from gpuscope.cli import main as gpuscope
from gpuscope.web.server import HubServer

MODES = ("asgi", "lean")


def serve(mode: str, argv: list[str]) -> int:
    """``gpuscope hub`` with agents' batches served the ``mode`` way."""
    defaults = HubServer.__init__.__kwdefaults__
    assert defaults is not None and "lean_ingest" in defaults
    defaults["lean_ingest"] = mode == "lean"  # the runtime builds its server with the default
    return gpuscope(argv)


def run(mode: str, nodes: int, n_ticks: int, agents: int) -> tuple[float, float, int, str]:
    """Event-loop and process CPU seconds, and batches, of the measured window; the load then."""
    with tempfile.TemporaryDirectory() as tmp:
        entry = [__file__, "--serve", mode, "--"]
        with gpuscope_hub(Path(tmp) / "hub.duckdb", ready_s=cpu.HUB_START_S, entry=entry) as (url, proc):
            ticks = cpu.node_ticks(nodes, n_ticks)
            hub = psutil.Process(proc.pid)
            loop_cpu: list[float] = []

            def process_cpu() -> float:
                # the event loop is the main thread: ``gpuscope hub`` serves in it
                main = next(t for t in hub.threads() if t.id == hub.pid)
                loop_cpu.append(main.user_time + main.system_time)
                times = hub.cpu_times()
                return float(times.user + times.system)

            used, batches, _ = cpu.post_node_ticks(url, ticks, agents, process_cpu)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return loop_cpu[1] - loop_cpu[0], used, batches, load


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":  # the hub process this script starts
        sys.exit(serve(sys.argv[2], sys.argv[4:]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="(asgi, lean) runs, alternating")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--agents", type=int, default=32, help="concurrent connections")
    a = ap.parse_args()
    rows = []
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for k in range(a.pairs):
        for mode in MODES:
            loop_s, process_s, batches, load = run(mode, a.nodes, a.ticks, a.agents)
            per = (loop_s * 1e3 / batches, process_s * 1e3 / batches)
            figures[mode].append(per)
            rows.append([f"{k + 1}", mode, f"{batches:,}", f"{per[0]:.3f}", f"{per[1]:.3f}", load])
            console.print(rows[-1])
    for mode in MODES:
        loops, processes = zip(*figures[mode], strict=True)
        rows.append(
            ["mean", mode, "", f"{statistics.mean(loops):.3f}", f"{statistics.mean(processes):.3f}", ""]
        )
    print_table(
        f"hub CPU per node batch, ASGI path vs lean path ({a.nodes} agents, {cpu.content_type})",
        [
            "pair",
            "ingest served",
            "batches",
            "event loop ms/batch",
            "process ms/batch",
            "load average (1 5 15)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
