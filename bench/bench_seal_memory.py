"""How far does sealing raw rows lift a hub's RSS, and how does ``storage.seal_interval_s`` bound it?

Every ``seal_interval_s`` the DuckDB store moves the hot table's closed rows into a Parquet piece,
sorted by GPU and time (``COPY ... ORDER BY entity, ts``), and once an hour is closed it merges
the hour's pieces into one file (their row groups joined undecoded, or small pieces written again
in runs; not sorted again). For 64 nodes an hour is about 2 million rows of ~50 metrics. The
sort is the largest allocation a hub makes (DuckDB's ``memory_limit`` caps it, the rest spills),
and the hot table it sorts is what DuckDB's buffer pool holds between seals; both scale with the
interval. ``--intervals 3600`` is the hourly seal of before (one sort of the whole hour, nothing
to merge).

This bench fills a durable store one interval at a time with the load generator's fleet (a 60-s
window ingested through the store, then copied forward by SQL, as ``bench_store_age`` does), with
the malloc settings a hub has (``limits.malloc_arenas`` 2, the fixed mmap threshold), and runs
the upkeep after each interval (the seal; after the hour's last interval the seal and the merge)
while a thread samples the process RSS every 5 ms. Each (interval, limit) runs in a fresh process.

The files' sizes printed beside are not a storage figure: the copied-forward window repeats
exactly every 60 s, which a whole-hour sort turns into long repeats that zstd removes
(``bench_storage.py`` measures bytes per sample on realistic telemetry).

Anchor, same run: the RSS before each upkeep (the process's working set with that interval in the
hot table); the figures are the largest lift above it among the pieces' seals, the lift of the
upkeep that also merges the hour, what the upkeeps left resident above it right after they ended
(and, for the last, 10 s later: DuckDB's allocator returns freed pages in the background too), the
highest RSS of the whole hour, and the RSS left at the end. Each upkeep runs the rollup (with the
seal) and retention, as a hub's does.

usage: python bench/bench_seal_memory.py [--nodes 64] [--intervals 3600,600,300] [--limits 256MB]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from common import console, print_table
from gpuscope import procmem
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.store.duckdb import DuckDBStore

MIB = 2**20
WINDOW_S = 60
HOUR_S = 3600
#: how long after the hour's last upkeep the RSS it left is read again
SETTLE_S = 10.0


class Peak(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="rss-peak")
        self.peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, procmem.rss_bytes())
            self._halt.wait(0.005)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak


def columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [
        str(r[0])
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples' "
            "ORDER BY ordinal_position"
        ).fetchall()
    ]


def fill(store: DuckDBStore, window: str, lo_s: int, hi_s: int, skip_first: bool) -> None:
    """The window's rows copied forward by [lo_s, hi_s) seconds into the hot table (behind the
    store's back)."""
    con = store._con.cursor()
    cols = columns(con)
    select = ", ".join(f"ts + k * {WINDOW_S * 1000}" if c == "ts" else c for c in cols)
    first = lo_s // WINDOW_S + (1 if skip_first else 0)
    con.execute(
        f"INSERT INTO samples ({', '.join(cols)}) SELECT {select} FROM {window}, "
        f"range({first}, {hi_s // WINDOW_S}) r(k)"
    )
    con.close()


def upkeep(store: DuckDBStore, now: float) -> dict[str, float]:
    """One upkeep at ``now`` as a hub's runs it (rollup with the seal, then retention; the clock's
    trim first, as the hub's runs end with one): RSS before, its peak, right after, seconds."""
    procmem.trim()
    peak = Peak()
    before = procmem.rss_bytes()
    peak.start()
    started, cpu0 = time.perf_counter(), time.process_time()
    store.rollup(now)
    store.compact(now)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    top = peak.stop()
    after = procmem.rss_bytes()
    return {"before": before / MIB, "peak": top / MIB, "after": after / MIB, "seconds": seconds, "cpu": cpu}


def one_run(nodes: int, limit: str, interval: int) -> dict[str, float]:
    """One store with ``limit`` and ``interval``: an hour filled and sealed interval by interval."""
    procmem.limit_arenas(2)
    procmem.fix_mmap_threshold()
    shape = FleetShape(nodes=nodes)
    hour = (int(time.time()) // HOUR_S - 3) * HOUR_S  # a whole hour, well in the past
    playback = Playback(scenario_doc(shape, WINDOW_S, faults=[]), 30, 60)
    with tempfile.TemporaryDirectory() as tmp:
        store = DuckDBStore(str(Path(tmp) / "seal.duckdb"), memory_limit=limit, seal_interval_s=interval)
        try:
            for _, outs in playback.ticks(hour):
                for o in outs:
                    store.append(decode_body(CONTENT_TYPE, o.body))
            store.stats()  # the acknowledged rows reach the tables
            window = store.stats()["rows"]["samples"]
            con = store._con.cursor()
            con.execute(f"CREATE TABLE bench_window AS SELECT * FROM samples WHERE ts < {(hour + 60) * 1000}")
            con.close()
            seals: list[dict[str, float]] = []
            for k in range(HOUR_S // interval):
                lo, hi = k * interval, (k + 1) * interval
                fill(store, "bench_window", lo, hi, skip_first=k == 0)
                store.rollup(hour + hi)  # a live hub rolls each minute up as it closes: not measured
                seals.append(upkeep(store, hour + hi + 2 * WINDOW_S))  # the seal (and, last, the merge)
            time.sleep(SETTLE_S)  # what stays resident once the allocators' background purges ran
            settled = procmem.rss_bytes()
            procmem.trim()
            after = procmem.rss_bytes()
            stats = store.stats()
        finally:
            store.close()
    pieces, last = seals[:-1] or seals, seals[-1]
    return {
        "rows_per_window": window,
        "sealed_rows": stats["raw_rows"] - stats["rows"]["samples"],
        "chunk_files": stats["chunk_files"],
        "chunk_mib": stats["chunk_bytes"] / MIB,
        "first_before_mib": seals[0]["before"],
        "piece_lift_mib": max(s["peak"] - s["before"] for s in pieces),
        "piece_seconds": max(s["seconds"] for s in pieces),
        "last_lift_mib": last["peak"] - last["before"],
        "last_seconds": last["seconds"],
        "piece_cpu_s": sum(s["cpu"] for s in pieces) / len(pieces),
        "last_cpu_s": last["cpu"],
        "piece_left_mib": max(s["after"] - s["before"] for s in pieces),
        "last_left_mib": last["after"] - last["before"],
        "last_settled_mib": settled / MIB - last["before"],
        "hour_peak_mib": max(s["peak"] for s in seals),
        "before_max_mib": max(s["before"] for s in seals),
        "after_trim_mib": after / MIB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--limits", default="256MB")
    ap.add_argument("--intervals", default="3600,600,300", help="storage.seal_interval_s values")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: "limit,interval" only
    args = ap.parse_args()
    if args.one is not None:
        limit, interval = args.one.split(",")
        print(json.dumps(one_run(args.nodes, limit, int(interval))))
        return
    load0 = os.getloadavg()[0]
    rows = []
    for limit in args.limits.split(","):
        for interval in args.intervals.split(","):
            child = subprocess.run(
                [sys.executable, __file__, "--nodes", str(args.nodes), "--one", f"{limit},{interval}"],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(child.stdout.strip().splitlines()[-1])
            console.print(f"memory_limit {limit}, seal_interval_s {interval}: {r}")
            rows.append(
                [
                    limit,
                    interval,
                    f"{r['sealed_rows']:,.0f} in {r['chunk_files']:.0f} ({r['chunk_mib']:.1f} MiB)",
                    f"{r['first_before_mib']:,.0f} .. {r['before_max_mib']:,.0f}",
                    f"{r['piece_lift_mib']:+,.0f} ({r['piece_seconds']:.1f} s)",
                    f"{r['last_lift_mib']:+,.0f} ({r['last_seconds']:.1f} s)",
                    f"{r['piece_cpu_s']:.2f} / {r['last_cpu_s']:.2f}",
                    f"{r['piece_left_mib']:+,.0f}",
                    f"{r['last_left_mib']:+,.0f} / {r['last_settled_mib']:+,.0f}",
                    f"{r['hour_peak_mib']:,.0f}",
                    f"{r['after_trim_mib']:,.0f}",
                ]
            )
    print_table(
        f"sealing an hour of {args.nodes} nodes, load {load0:.1f} -> {os.getloadavg()[0]:.1f}",
        [
            "memory_limit",
            "seal_interval_s",
            "rows sealed in files (size)",
            "RSS before upkeeps MiB (anchor)",
            "largest piece seal lift MiB",
            "last upkeep lift (seal + merge) MiB",
            "CPU-s: piece upkeep (mean) / last (seal + merge), all threads",
            "largest piece upkeep's RSS left MiB",
            f"last upkeep's RSS left, right after / {SETTLE_S:g} s later MiB",
            "hour's peak MiB",
            "end, after trim MiB",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
