"""Does the hub's CPU per sample grow with its store's age? Young store against a 2-hour-old one.

The same live window of fleet traffic (the load generator's pre-encoded agent frames and SDK
batches, decoded as the ingest route decodes them) goes through a hub in virtual time twice:

- **young**: on a fresh durable DuckDB store;
- **aged**: on the same store after it was made to hold ``--age`` seconds (2 hours) more of the
  same fleet: the young window's raw rows, training records, events (heartbeats), batch ids and
  GPU-time cells copied forward in time by SQL (minutes instead of hours of ingest), then one
  upkeep (rollups of the whole age, the hourly seal into Parquet, retention, checkpoint). A fresh
  hub then resumes on it (warm-up from the store, as after a restart) and takes the window.

Each window costs: ingest (decode, store append, detection, productivity), evaluation each
second, upkeep each minute (``Hub.maintain``), one read of every stored alert each second (what
``gpuscope loadgen``'s alert watcher asks of the hub), and the store's own threads (the tick's
DuckDB commit, the log's sync). Figures are CPU seconds of the whole process over the samples
stored: µs per sample, young beside aged.

Anchor, same run: VictoriaMetrics ingesting the same node samples (Prometheus text, one request
per 16 nodes, ``/api/v1/import/prometheus``), its CPU per sample from psutil.

usage: python bench/bench_store_age.py [--nodes 16] [--window 120] [--age 7200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench_load import prometheus_bodies
from common import console, print_table, victoria_metrics
from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, Outgoing, scenario_doc
from gpuscope.runtime import evaluation_hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import _alert_json

PARTS = ("ingest", "evaluate", "maintain", "alert reads")


@dataclass(slots=True)
class Window:
    label: str
    seconds: int
    samples: int
    parts: dict[str, float]  # CPU seconds of the calling thread per part
    process: float  # CPU seconds of the whole process (store threads included)
    rows: dict[str, int]
    duckdb_mib: float  # DuckDB's own accounting at the end (buffer pool: bounded by its limit)
    disk_mib: float

    @property
    def us_per_sample(self) -> float:
        return self.process * 1e6 / max(self.samples, 1)


def run_window(store: DuckDBStore, label: str, ticks: Iterable[tuple[float, list[Outgoing]]]) -> Window:
    """One fresh hub on ``store`` resumes, then takes every tick as a live hub would."""
    ticks = list(ticks)
    hub: Hub = evaluation_hub(store, 2.5)
    hub.resume(ticks[0][0])
    parts = dict.fromkeys(PARTS, 0.0)
    samples = 0
    p0 = time.process_time()
    for t, outs in ticks:
        c0 = time.thread_time()
        for o in outs:
            samples += hub.ingest(decode_body(CONTENT_TYPE, o.body)).samples
        c1 = time.thread_time()
        hub.evaluate(t)
        c2 = time.thread_time()
        if int(t) % 60 == 0:
            hub.maintain(t)
        c3 = time.thread_time()
        [_alert_json(a) for a in hub.stored_alerts(False, 100_000)]
        c4 = time.thread_time()
        for name, spent in zip(PARTS, (c1 - c0, c2 - c1, c3 - c2, c4 - c3), strict=True):
            parts[name] += spent
    process = time.process_time() - p0
    stats = store.stats()
    memory = sum(store.memory().values()) / 2**20
    disk = stats["disk_bytes"] / 2**20
    return Window(label, len(ticks), samples, parts, process, stats["rows"], memory, disk)


def age_store(store: DuckDBStore, span: int, copies: int) -> float:
    """Copy what the store holds (``span`` seconds of the fleet) ``copies`` times forward in time,
    then run one upkeep at the end of it. Returns the upkeep's CPU seconds."""
    con = store._con.cursor()  # the bench fills the tables behind the store's back, on purpose

    def names(table: str) -> list[str]:
        rows = con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
            "ORDER BY ordinal_position",
            [table],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def copy(table: str, shift: str, where: str = "TRUE") -> None:
        cols = names(table)
        select = ", ".join(f"{c} + k * {shift}" if c in ("ts", "bucket") else c for c in cols)
        keyed = " OR IGNORE" if table == "gpu_time" else ""  # a minute may repeat a cell's key
        con.execute(
            f"INSERT{keyed} INTO {table} ({', '.join(cols)}) "
            f"SELECT {select} FROM {table}, range(1, {copies + 1}) r(k) WHERE {where}"
        )

    con.execute("BEGIN")
    copy("samples", str(span * 1000))
    copy("training", f"{float(span)}")
    copy("events", f"{float(span)}", "kind NOT LIKE 'job_%'")
    copy("gpu_time", f"{float(span)}", "res = 60")
    con.execute(
        "INSERT INTO batch_ids SELECT id || '-' || k, received, seq + k * (SELECT max(seq) FROM batch_ids) "
        f"FROM batch_ids, range(1, {copies + 1}) r(k)"
    )
    con.execute("COMMIT")
    con.close()
    end = time.time()
    started = time.process_time()
    store.rollup(end)
    store.compact(end)
    return time.process_time() - started


def victoria_anchor(shape: FleetShape, seconds: int) -> float | None:
    """VictoriaMetrics' µs of CPU per sample on the same node samples, or None without it."""
    bodies = prometheus_bodies(shape, min(seconds, 10))
    with victoria_metrics() as vm:
        if vm is None:
            return None
        proc = next(
            p
            for p in psutil.process_iter(["cmdline"])
            if any(str(vm[1]) in a for a in p.info["cmdline"] or [])
        )
        samples = 0
        with httpx.Client(base_url=vm[0], timeout=60) as client:
            t = proc.cpu_times()
            cpu0 = t.user + t.system
            for k in range(seconds):
                for body in bodies[k % len(bodies)]:
                    client.post("/api/v1/import/prometheus", content=body).raise_for_status()
                    samples += body.count(b"\n")
            time.sleep(2.0)  # its buffers go to parts within a second: count that too
            t = proc.cpu_times()
        return (t.user + t.system - cpu0) * 1e6 / max(samples, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--window", type=int, default=120, help="seconds of live traffic per window")
    ap.add_argument("--age", type=int, default=7200, help="seconds of fleet data the aged store holds")
    args = ap.parse_args()
    shape = FleetShape(nodes=args.nodes)
    load0 = os.getloadavg()[0]
    playback = Playback(scenario_doc(shape, args.window, faults=[]), 30, 60)
    copies = args.age // args.window
    later = (copies + 1) * args.window
    t0 = time.time() - later - args.window
    with tempfile.TemporaryDirectory() as tmp:
        store = DuckDBStore(str(Path(tmp) / "age.duckdb"))
        try:
            young = run_window(store, "young store", playback.ticks(t0))
            console.print(f"ageing the store by {copies * args.window} s of the same fleet")
            upkeep = age_store(store, args.window, copies)
            aged = run_window(store, f"store {args.age / 3600:g} h old", playback.ticks(t0 + later))
        finally:
            store.close()
    anchor = victoria_anchor(shape, args.window)
    load1 = os.getloadavg()[0]
    rows = [
        [
            w.label,
            f"{w.rows['samples'] + w.rows['rollup_1m']:,} / {w.rows['events']:,} / {w.rows['batch_ids']:,}",
            f"{w.disk_mib:,.0f} / {w.duckdb_mib:,.0f}",
            *(f"{w.parts[p] * 1000 / w.seconds:.1f}" for p in PARTS),
            f"{(w.process - sum(w.parts.values())) * 1000 / w.seconds:.1f}",
            f"{w.us_per_sample:.2f}",
        ]
        for w in (young, aged)
    ]
    rows.append(
        [
            "anchor: VictoriaMetrics, same node samples",
            "-",
            "-",
            *("-" for _ in PARTS),
            "-",
            "skipped (not installed)" if anchor is None else f"{anchor:.2f}",
        ]
    )
    print_table(
        f"hub CPU per sample by store age, {args.nodes} nodes, {args.window} s windows, "
        f"load {load0:.1f} -> {load1:.1f}",
        [
            "store",
            "hot+1m rows / events / batch ids",
            "disk / DuckDB memory MiB",
            *(f"{p} ms/s" for p in PARTS),
            "store threads ms/s",
            "µs CPU per sample",
        ],
        rows,
    )
    console.print(
        f"the ageing upkeep (rollups of the whole age, the seal, retention) took {upkeep:.1f} CPU-s once"
    )


if __name__ == "__main__":
    main()
