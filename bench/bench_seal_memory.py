"""How far does the hourly seal lift a hub's RSS, and does ``storage.memory_limit`` bound it?

Once an hour the DuckDB store moves the hour's raw rows into a Parquet chunk, sorted by GPU and
time (``COPY ... ORDER BY entity, ts``): for 64 nodes an hour is about 1.8 million rows of ~50
metrics. The sort is the largest allocation a hub makes; DuckDB's ``memory_limit`` caps it (the
rest spills to a temporary file). This bench fills a durable store with one hour of the load
generator's fleet (a 60-s window ingested through the store, then copied forward by SQL, as
``bench_store_age`` does), then runs the upkeep that seals it while a thread samples the process
RSS every 5 ms. Each ``--limits`` value runs in a fresh process.

Anchor, same run: the RSS before the seal (the hub's working set with that hour in the store);
the figure is the seal's peak above it, beside the limit, and the RSS left after the upkeep and
the clock's ``malloc_trim``.

usage: python bench/bench_seal_memory.py [--nodes 64] [--limits 512MB,256MB,128MB]
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

from common import console, print_table
from gpuscope import procmem
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.store.duckdb import DuckDBStore

MIB = 2**20
WINDOW_S = 60
HOUR_S = 3600


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


def fill_hour(store: DuckDBStore) -> None:
    """The window's raw rows copied forward until they span the hour (behind the store's back)."""
    con = store._con.cursor()
    cols = [
        str(r[0])
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples' "
            "ORDER BY ordinal_position"
        ).fetchall()
    ]
    select = ", ".join(f"ts + k * {WINDOW_S * 1000}" if c == "ts" else c for c in cols)
    con.execute(
        f"INSERT INTO samples ({', '.join(cols)}) SELECT {select} FROM samples, "
        f"range(1, {HOUR_S // WINDOW_S}) r(k)"
    )
    con.execute("CHECKPOINT")
    con.close()


def one_limit(nodes: int, limit: str) -> dict[str, float]:
    """One store with ``limit``: fill an hour, seal it; RSS before, peak, after (MiB)."""
    shape = FleetShape(nodes=nodes)
    hour = (int(time.time()) // HOUR_S - 3) * HOUR_S  # a whole hour, well in the past
    playback = Playback(scenario_doc(shape, WINDOW_S, faults=[]), 30, 60)
    with tempfile.TemporaryDirectory() as tmp:
        store = DuckDBStore(str(Path(tmp) / "seal.duckdb"), memory_limit=limit)
        try:
            for _, outs in playback.ticks(hour):
                for o in outs:
                    store.append(decode_body(CONTENT_TYPE, o.body))
            store.stats()  # the acknowledged rows reach the tables
            window = store.stats()["rows"]["samples"]
            fill_hour(store)
            store.rollup(hour + HOUR_S)  # a live hub rolls each minute up as it closes: not measured
            procmem.trim()
            peak = Peak()
            before = procmem.rss_bytes()
            peak.start()
            started = time.perf_counter()
            store.rollup(hour + HOUR_S + 2 * WINDOW_S)  # the upkeep after the hour: the seal
            seconds = time.perf_counter() - started
            top = peak.stop()
            after_upkeep = procmem.rss_bytes()
            procmem.trim()
            after = procmem.rss_bytes()
            stats = store.stats()
        finally:
            store.close()
    return {
        "rows_per_window": window,
        "sealed_rows": stats["raw_rows"] - stats["rows"]["samples"],
        "chunk_files": stats["chunk_files"],
        "before_mib": before / MIB,
        "peak_mib": top / MIB,
        "after_upkeep_mib": after_upkeep / MIB,
        "after_trim_mib": after / MIB,
        "seconds": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--limits", default="512MB,256MB,128MB")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: this limit only
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_limit(args.nodes, args.one)))
        return
    load0 = os.getloadavg()[0]
    rows = []
    for limit in args.limits.split(","):
        child = subprocess.run(
            [sys.executable, __file__, "--nodes", str(args.nodes), "--one", limit],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(child.stdout.strip().splitlines()[-1])
        console.print(f"memory_limit {limit}: {r}")
        rows.append(
            [
                limit,
                f"{r['sealed_rows']:,.0f}",
                f"{r['before_mib']:,.0f}",
                f"{r['peak_mib']:,.0f}",
                f"{r['peak_mib'] - r['before_mib']:+,.0f}",
                f"{r['after_upkeep_mib']:,.0f}",
                f"{r['after_trim_mib']:,.0f}",
                f"{r['seconds']:.1f}",
            ]
        )
    print_table(
        f"the hourly seal of {args.nodes} nodes, load {load0:.1f} -> {os.getloadavg()[0]:.1f}",
        [
            "storage.memory_limit",
            "rows sealed",
            "RSS before MiB (anchor)",
            "peak MiB",
            "seal lift MiB",
            "after upkeep MiB",
            "after trim MiB",
            "seal upkeep s",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
