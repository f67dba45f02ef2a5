"""Hub memory over a soak: where the resident set goes as hours of agent-shaped data arrive.

A hub (the same ``Hub`` and DuckDB store a ``gpuscope hub`` process runs) is fed a simulated fleet
fast-forwarded through simulated time: every node's batch each second, detectors evaluated each
second, store maintenance each minute. Every ``--report`` simulated seconds it prints the process
RSS beside where it goes: DuckDB's own accounting (``duckdb_memory()``: buffer pool and caches) and
the Python heap (``tracemalloc``, when ``--trace``), so growth can be pinned on one of them.

Anchor, same run: the same soak with the store's DuckDB memory limit left at DuckDB's default
(80 % of the machine's RAM), which is what the 6-hour run had. The figure is RSS growth after the
first ``--warm`` simulated seconds (issue 13 (d): ≤ 10 %).

usage: python bench/bench_memory.py [--nodes 32] [--seconds 900] [--report 150] [--trace]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

import psutil

from common import console, print_table
from gpuscope.hub import Hub
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore


def duckdb_bytes(store: DuckDBStore) -> int:
    rows = store.memory()
    return sum(int(v) for v in rows.values())


def soak(
    nodes: int, seconds: int, report: int, warm: int, memory_limit: str | None, trace: bool
) -> list[tuple[int, int, int, int]]:
    """(simulated second, RSS, DuckDB bytes, Python traced bytes) every ``report`` seconds."""
    proc = psutil.Process()
    t0 = time.time() - seconds - 60
    scenario = build_scenario(FleetShape(nodes=nodes), seconds, faults=[])
    out: list[tuple[int, int, int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # buffered appends (committed every few thousand rows): one sequential feeder waiting for
        # each group commit would take a wall second per simulated second; the memory is the same
        store = DuckDBStore(str(Path(tmp) / "hub.duckdb"), memory_limit=memory_limit, durable=False)
        hub = Hub(store)
        if trace:
            tracemalloc.start()
        for tick in Simulator(scenario, t0=t0).ticks():
            now = t0 + tick.t
            for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
                hub.ingest(batch)
            hub.evaluate(now)
            second = int(tick.t)
            if second % 60 == 0:
                hub.maintain(now)
            if second % report == 0 and second >= warm:
                gc.collect()
                traced = tracemalloc.get_traced_memory()[0] if trace else 0
                rss, duck = proc.memory_info().rss, duckdb_bytes(store)
                out.append((second, rss, duck, traced))
                console.print(
                    f"t={second:>6} s  RSS {rss / 2**20:7.0f} MiB  DuckDB {duck / 2**20:7.0f} MiB"
                    + (f"  Python heap {traced / 2**20:6.0f} MiB" if trace else "")
                )
        if trace:
            tracemalloc.stop()
        store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--seconds", type=int, default=900, help="simulated seconds of the soak")
    ap.add_argument("--report", type=int, default=150)
    ap.add_argument("--warm", type=int, default=300, help="growth is measured from here")
    ap.add_argument("--memory-limit", default="512MB", help="the store's DuckDB memory limit")
    ap.add_argument("--trace", action="store_true", help="also trace the Python heap (slow)")
    ap.add_argument("--no-anchor", action="store_true")
    a = ap.parse_args()
    runs = [(f"DuckDB memory_limit {a.memory_limit}", a.memory_limit)]
    if not a.no_anchor:
        runs.append(("anchor: DuckDB's default memory limit (80 % of RAM)", None))
    rows = []
    for name, limit in runs:
        console.print(f"[bold]{name}[/bold]: {a.nodes} nodes, {a.seconds} simulated s")
        started = time.monotonic()
        points = soak(a.nodes, a.seconds, a.report, a.warm, limit, a.trace)
        first, last = points[0], points[-1]
        rows.append(
            [
                name,
                f"{first[1] / 2**20:.0f} → {last[1] / 2**20:.0f}",
                f"{(last[1] - first[1]) / first[1] * 100:+.1f} %",
                f"{first[2] / 2**20:.0f} → {last[2] / 2**20:.0f}",
                f"{time.monotonic() - started:.0f} s",
            ]
        )
    load = os.getloadavg()
    print_table(
        f"hub RSS over a {a.seconds}-s soak, {a.nodes} nodes, from t={a.warm} s "
        f"(load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
        ["store", "RSS MiB", "growth (≤ 10 %)", "DuckDB MiB", "wall"],
        rows,
    )


if __name__ == "__main__":
    main()
