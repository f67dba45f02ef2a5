"""Which step of a hub's minute upkeep lifts DuckDB's allocator, and by how much?

A 64-node hub's RSS swings by 50-60 MiB each minute, and DuckDB's jemalloc moves with it
(docs/scaling.md (d), "hubmem"). The upkeep is several steps on one connection: the seal (a
count, the piece's ``COPY ... ORDER BY entity, ts`` to Parquet, the DELETE of the sealed rows,
the commit, a checkpoint), the merge of a closed hour, the 1-minute and 1-hour rollups, retention
(deletes, a checkpoint past a WAL size), the cache shed and the allocator purge. This bench names
each step while a thread samples, every few milliseconds, the process RSS, jemalloc's
``stats.allocated`` and ``stats.resident`` and DuckDB's buffer pool by tag (``duckdb_memory()``),
and prints, for each step, the largest rise above the value at the start of the upkeep.

The store is filled as a hub fills it: the load generator's fleet decoded and appended tick by
tick, the writer flushing every 5 s (``flush_interval_s``), and the upkeep runs a minute after
each minute, as ``Hub.maintain`` does (rollup with the seal, then retention), so the hot table
holds one to two minutes of rows when it runs. Anchor, same run: the values at the start of each
upkeep (what the process holds with the live minutes in the hot table).

usage: python bench/bench_upkeep_steps.py [--nodes 64] [--minutes 8] [--slice-rows N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb

from common import console, print_table
from gpuscope import procmem
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.store.duckdb import DuckDBStore, chunks, maintenance
from gpuscope.store.duckdb import upkeep as upkeep_mod
from gpuscope.store.duckdb.allocator import ALLOCATOR

MIB = 2**20
MINUTE_S = 60
HOUR_S = 3600
FLUSH_S = 5
#: a pool reading every this many samples (a query: heavier than the allocator's counters)
POOL_EVERY = 4


class Steps(threading.Thread):
    """Samples memory every ``period_s`` and charges each reading to the innermost named step."""

    def __init__(self, pool: Callable[[], dict[str, int]], period_s: float = 0.004) -> None:
        super().__init__(daemon=True, name="upkeep-steps")
        self.pool = pool
        self.period_s = period_s
        self.stack: list[str] = []
        self.peaks: dict[str, dict[str, float]] = {}
        self.tags_at_peak: dict[str, dict[str, int]] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self._lock:
            self.stack.append(name)
        try:
            yield
        finally:
            with self._lock:
                self.stack.pop()

    def reading(self, with_pool: bool) -> dict[str, Any]:
        je = ALLOCATOR.read()
        out: dict[str, Any] = {
            "rss": procmem.rss_bytes(),
            "je_allocated": je.get("allocated", 0),
            "je_resident": je.get("resident", 0),
        }
        if with_pool:
            tags = self.pool()
            out["pool"] = sum(tags.values())
            out["tags"] = tags
        return out

    def run(self) -> None:
        k = 0
        while not self._halt.is_set():
            r = self.reading(k % POOL_EVERY == 0)
            k += 1
            with self._lock:
                name = self.stack[-1] if self.stack else "(between)"
            peak = self.peaks.setdefault(name, {})
            for key in ("rss", "je_allocated", "je_resident", "pool"):
                if key in r and r[key] > peak.get(key, 0):
                    peak[key] = r[key]
                    if key == "pool":
                        self.tags_at_peak[name] = r["tags"]
            self._halt.wait(self.period_s)

    def take(self) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
        with self._lock:
            peaks, tags = self.peaks, self.tags_at_peak
            self.peaks, self.tags_at_peak = {}, {}
        return peaks, tags

    def stop(self) -> None:
        self._halt.set()
        self.join()


def wrap(owner: Any, attr: str, steps: Steps, name: str) -> None:
    """Replace ``owner.attr`` (a function or bound method) by one that runs as step ``name``."""
    fn = getattr(owner, attr)

    def named(*args: Any, **kwargs: Any) -> Any:
        with steps.step(name):
            return fn(*args, **kwargs)

    setattr(owner, attr, named)


def instrument(store: DuckDBStore, steps: Steps) -> None:
    up = store._upkeep
    wrap(up, "seal", steps, "seal: count, delete, commit")
    wrap(chunks, "_copy", steps, "seal: COPY ... ORDER BY to Parquet")
    wrap(up, "checkpoint", steps, "checkpoint")
    wrap(up, "merge", steps, "merge")
    wrap(maintenance, "rollup_minutes", steps, "rollup 1m")
    wrap(maintenance, "rollup_hours", steps, "rollup 1h")
    wrap(up, "shed_cache", steps, "cache shed")
    wrap(up, "purge", steps, "purge")
    assert upkeep_mod.sql is maintenance


def pool_reader(store: DuckDBStore) -> Callable[[], dict[str, int]]:
    cons: dict[int, duckdb.DuckDBPyConnection] = {}  # a cursor per thread: one call at a time each

    def read() -> dict[str, int]:
        me = threading.get_ident()
        con = cons.get(me)
        if con is None:
            con = cons[me] = store._con.cursor()
        rows = con.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0")
        return {str(t): int(b) for t, b in rows.fetchall()}

    return read


def run(nodes: int, minutes: int, slice_rows: int | None) -> dict[str, Any]:
    procmem.limit_arenas(2)
    procmem.fix_mmap_threshold()
    if slice_rows is not None:
        chunks.SEAL_SORT_ROWS = slice_rows
    shape = FleetShape(nodes=nodes)
    t0 = (int(time.time()) // HOUR_S - 3) * HOUR_S + 5 * MINUTE_S  # well in the past, no hour closes
    playback = Playback(scenario_doc(shape, minutes * MINUTE_S, faults=[]), 30, 60)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = DuckDBStore(str(Path(tmp) / "steps.duckdb"), flush_interval_s=3600.0)
        steps = Steps(pool_reader(store))
        instrument(store, steps)
        steps.start()
        try:
            for t, outs in playback.ticks(t0):
                for o in outs:
                    store.append(decode_body(CONTENT_TYPE, o.body))
                k = round(t - t0)
                if k % FLUSH_S == 0:
                    store._flush()
                if k % MINUTE_S == 0 and k >= 2 * MINUTE_S:
                    procmem.trim()
                    time.sleep(0.05)
                    base = steps.reading(True)
                    steps.take()
                    started = time.perf_counter()
                    with steps.step("rollup (rest)"):
                        store.rollup(t + 15)
                    with steps.step("retention (rest)"):
                        store.compact(t + 15)
                    seconds = time.perf_counter() - started
                    peaks, tags = steps.take()
                    rows.append(
                        {
                            "minute": k // MINUTE_S,
                            "seconds": seconds,
                            "base": {
                                key: base[key] for key in ("rss", "je_allocated", "je_resident", "pool")
                            },
                            "base_tags": base["tags"],
                            "hot_rows": store.stats()["rows"]["samples"],
                            "peaks": peaks,
                            "tags_at_peak": tags,
                        }
                    )
        finally:
            steps.stop()
            store.close()
    return {"nodes": nodes, "slice_rows": slice_rows, "upkeeps": rows}


def lift(row: dict[str, Any], step: str, key: str) -> float:
    peak = row["peaks"].get(step, {}).get(key)
    return (peak - row["base"][key]) / MIB if peak is not None else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--minutes", type=int, default=8)
    ap.add_argument("--slice-rows", type=int, default=None, help="override chunks.SEAL_SORT_ROWS")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    result = run(args.nodes, args.minutes, args.slice_rows)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    ups = result["upkeeps"]
    names = sorted({s for r in ups for s in r["peaks"]})
    table = []
    for step in names:
        cells = [step]
        for key in ("je_allocated", "je_resident", "pool", "rss"):
            values = [v for r in ups if (v := lift(r, step, key)) == v]
            cells.append(f"{min(values):+.0f} .. {max(values):+.0f}" if values else "-")
        worst = max(ups, key=lambda r: lift(r, step, "pool") if step in r["peaks"] else -1e9)
        top = sorted(worst["tags_at_peak"].get(step, {}).items(), key=lambda kv: -kv[1])[:3]
        cells.append(", ".join(f"{t} {b / MIB:.0f}" for t, b in top))
        table.append(cells)
    base = [r["base"] for r in ups]

    def span(key: str) -> str:
        return f"{min(b[key] for b in base) / MIB:.0f}..{max(b[key] for b in base) / MIB:.0f}"

    hot = [r["hot_rows"] for r in ups]
    took = [r["seconds"] for r in ups]
    console.print(
        f"{len(ups)} upkeeps; at their start: RSS {span('rss')} MiB, jemalloc allocated "
        f"{span('je_allocated')}, pool {span('pool')} MiB; hot rows {min(hot):,}..{max(hot):,}; "
        f"upkeep {min(took):.2f}..{max(took):.2f} s"
    )
    print_table(
        f"upkeep steps, {args.nodes} nodes, rise above the upkeep's start (MiB, min .. max over upkeeps), "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}",
        ["step", "jemalloc allocated", "jemalloc resident", "DuckDB pool", "RSS", "pool tags at the largest"],
        table,
    )


if __name__ == "__main__":
    main()
