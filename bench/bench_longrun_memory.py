"""Memory soak of the long run: is the hub's resident set flat, and where does it go? (issue 13 (d))

The run is :mod:`bench_longrun`'s, the one whose 6-hour run peaked at 4.7 GiB: a real hub (HTTP,
durable DuckDB store, alerting) with the demo cluster's agents and simulated SDKs in ONE process,
virtual time at full speed. A thread samples the process RSS every half second; every ``--probe``
simulated seconds the bench also notes where memory goes:

- the hub: DuckDB's own accounting (``duckdb_memory()``), alerts and incidents held in memory,
  batch ids remembered for de-duplication;
- the senders' bookkeeping, which is the bench's and not the hub's: the ledger of every batch built
  and acknowledged (it grows by design: the exact count at the end needs it);
- with ``--trace``, the Python heap (``tracemalloc``) split by the module that allocated it: hub
  modules, sender modules (agents, simulator, fake NVML, the ledger), other (libraries).

Anchor, same run: a VictoriaMetrics single node fed the same samples (every batch the hub stored,
as Prometheus text) while the soak runs; its RSS is sampled beside the hub's.

The figure is RSS after the first ``--warm`` simulated seconds against the largest RSS afterwards
(issue 13 (d): growth ≤ 10 %), and the transient peaks between probes (what ``ru_maxrss`` and
so the 6-hour figure record).

usage: python bench/bench_longrun_memory.py [--hours 1] [--wall-minutes 25] [--probe 300] [--trace]
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import psutil

import bench_longrun as longrun
from common import console, print_table, victoria_metrics_binary
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.remote.local import LocalTSDB, start_victoria_metrics

MIB = 2**20
#: allocation sites (path fragments) on the senders' side of the one process
SENDER_CODE = ("/gpuscope/agent/", "/gpuscope/sim/", "/gpuscope/collect/", "/gpuscope/sdk/", "bench_longrun")


@dataclass(slots=True)
class Probe:
    t: float  # simulated seconds
    rss: int
    peak: int  # the largest RSS sampled since the previous probe
    vm_rss: int
    vm_peak: int
    duckdb: int
    alerts: int
    incidents: int
    batch_ids: int
    ledger: int  # entries in the senders' ledger
    heap_hub: int
    heap_senders: int
    heap_other: int


class RssSampler(threading.Thread):
    """Samples RSS of this process (and of the anchor) every ``every`` seconds; keeps the maxima."""

    def __init__(self, vm_pid: int | None, every: float = 0.5) -> None:
        super().__init__(daemon=True, name="soak-rss")
        self.me = psutil.Process()
        self.vm = psutil.Process(vm_pid) if vm_pid is not None else None
        self.every = every
        self.stopped = threading.Event()
        self.peak = 0
        self.vm_peak = 0

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.peak = max(self.peak, self.me.memory_info().rss)
            if self.vm is not None:
                self.vm_peak = max(self.vm_peak, self.vm.memory_info().rss)

    def take(self) -> tuple[int, int]:
        """The peaks since the last call (the current RSS at least), then start again."""
        now = self.me.memory_info().rss
        peak, vm_peak = max(self.peak, now), self.vm_peak
        self.peak = self.vm_peak = 0
        return peak, vm_peak


class VictoriaFeed(threading.Thread):
    """Posts every batch the hub stored to VictoriaMetrics as Prometheus text (its own thread:
    the hub's ingest must not wait for the anchor)."""

    def __init__(self, db: LocalTSDB) -> None:
        super().__init__(daemon=True, name="soak-vm-feed")
        self.client = httpx.Client(base_url=db.url, timeout=60)
        self.batches: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self.samples = 0

    def observe(self, batch: Batch) -> None:
        if batch.frames:
            self.batches.put(batch)

    def run(self) -> None:
        while (batch := self.batches.get()) is not None:
            lines = []
            for frame in batch.frames:
                for labels, row in zip(frame.entities, frame.values.tolist(), strict=True):
                    sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    lines += [
                        f"{m}{{{sel}}} {v:.6g}" for m, v in zip(frame.metrics, row, strict=True) if v == v
                    ]
            if lines:
                self.client.post(
                    "/api/v1/import/prometheus", content="\n".join(lines) + "\n"
                ).raise_for_status()
                self.samples += len(lines)

    def stop(self) -> None:
        self.batches.put(None)
        self.join(timeout=120)
        self.client.close()


def heap_split() -> tuple[int, int, int]:
    """Traced Python heap bytes allocated by hub modules, sender modules, and everything else."""
    hub = senders = other = 0
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        name = stat.traceback[0].filename
        if any(part in name for part in SENDER_CODE):
            senders += stat.size
        elif "/gpuscope/" in name:
            hub += stat.size
        else:
            other += stat.size
    return hub, senders, other


def growth(series: list[tuple[float, int]], warm: float) -> tuple[int, int, float] | None:
    """(RSS at the first point from ``warm``, the largest RSS after it, growth %)."""
    after = [(t, v) for t, v in series if t >= warm and v > 0]
    if len(after) < 2:
        return None
    first = after[0][1]
    top = max(v for _, v in after[1:])
    return first, top, (top - first) / first * 100


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours at most")
    ap.add_argument("--wall-minutes", type=float, default=25.0, help="stop earlier after this wall time")
    ap.add_argument("--probe", type=float, default=300.0, help="simulated seconds between probes")
    ap.add_argument("--warm", type=float, default=600.0, help="growth is measured from here (simulated s)")
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument(
        "--trace",
        action="store_true",
        help="split the Python heap by module (slower; tracemalloc's own memory then counts in RSS)",
    )
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)  # a late ack under load is retried
    workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    binary = victoria_metrics_binary()
    db = start_victoria_metrics(binary) if binary else None
    if db is None:
        console.print("[yellow]victoria-metrics not installed: its anchor is skipped[/yellow]")
    feed = VictoriaFeed(db) if db is not None else None
    sampler = RssSampler(db.proc.pid if db is not None else None)
    probes: list[Probe] = []
    started = time.monotonic()
    deadline = started + a.wall_minutes * 60

    def probe(t: float, hub: Hub, ledger: longrun.Ledger) -> None:
        if feed is not None and not feed.is_alive():
            feed.start()
            hub.add_observer(feed.observe)
        rss = psutil.Process().memory_info().rss  # before the probe's own allocations
        peak, vm_peak = sampler.take()
        store = cast(DuckDBStore, hub.store)  # the long run's store
        alerts, incidents = hub.alert_view()
        heap = heap_split() if a.trace else (0, 0, 0)
        p = Probe(
            t=t,
            rss=rss,
            peak=peak,
            vm_rss=sampler.vm.memory_info().rss if sampler.vm is not None else 0,
            vm_peak=vm_peak,
            duckdb=sum(store.memory().values()),
            alerts=len(alerts),
            incidents=len(incidents),
            batch_ids=len(store.batch_ids),
            ledger=len(ledger.built) + len(ledger.acked),
            heap_hub=heap[0],
            heap_senders=heap[1],
            heap_other=heap[2],
        )
        probes.append(p)
        console.print(
            f"t={t:>6.0f} s  wall {time.monotonic() - started:5.0f} s  RSS {p.rss / MIB:6.0f} MiB "
            f"(peak {p.peak / MIB:6.0f})  VictoriaMetrics {p.vm_rss / MIB:5.0f}  "
            f"DuckDB {p.duckdb / MIB:5.0f}  "
            f"alerts {p.alerts}  batch ids {p.batch_ids}  ledger {p.ledger}"
            + (
                f"  heap hub {p.heap_hub / MIB:5.1f} senders {p.heap_senders / MIB:5.1f} "
                f"other {p.heap_other / MIB:5.1f} MiB"
                if a.trace
                else ""
            )
        )

    if a.trace:
        tracemalloc.start()
    sampler.start()
    try:
        run = longrun.run_longrun(
            workdir,
            duration=a.hours * 3600,
            seed=a.seed,
            t0=longrun.EPOCH_HOUR + 50 * 60,
            probe=probe,
            probe_every=a.probe,
            until=lambda: time.monotonic() > deadline,
        )
    finally:
        sampler.stopped.set()
        if feed is not None:
            feed.stop()
        if db is not None:
            db.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()
    simulated = probes[-1].t if probes else 0.0
    rows = []
    for name, points, peaks in (
        (
            "gpuscope: hub + senders, one process",
            [(p.t, p.rss) for p in probes],
            [p.peak for p in probes],
        ),
        (
            "anchor: VictoriaMetrics, same samples (own process)",
            [(p.t, p.vm_rss) for p in probes],
            [p.vm_peak for p in probes],
        ),
    ):
        g = growth(points, a.warm)
        if g is None:
            rows.append([name, "-", "-", "-", "-"])
            continue
        top_transient = max((v for (t, _), v in zip(points, peaks, strict=False) if t > a.warm), default=0)
        rows.append(
            [
                name,
                f"{g[0] / MIB:,.0f}",
                f"{g[1] / MIB:,.0f}",
                f"{g[2]:+.1f} %",
                f"{top_transient / MIB:,.0f}" if top_transient else "-",
            ]
        )
    print_table(
        f"RSS over a soak of {simulated / 3600:.2f} simulated hours in {run.wall_s / 60:.0f} wall minutes "
        f"(load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
        [
            "process",
            f"RSS at {a.warm:g} s, MiB",
            "largest afterwards (probes)",
            "growth (≤ 10 %)",
            "transient peak between probes",
        ],
        rows,
    )
    first = next((p for p in probes if p.t >= a.warm), None)
    last = probes[-1] if probes else None
    if first is not None and last is not None and last is not first:
        hours = max((last.t - first.t) / 3600, 1e-9)
        parts = [
            ("DuckDB (duckdb_memory)", first.duckdb, last.duckdb),
            ("Python heap, hub modules", first.heap_hub, last.heap_hub),
            ("Python heap, senders (agents, simulator, ledger)", first.heap_senders, last.heap_senders),
            ("Python heap, other (libraries)", first.heap_other, last.heap_other),
        ]
        rows = [
            [what, f"{x / MIB:,.1f}", f"{y / MIB:,.1f}", f"{(y - x) / MIB / hours:+,.1f}"]
            for what, x, y in parts
            if a.trace or what.startswith("DuckDB")
        ]
        counts = [
            ("alerts held by the hub", first.alerts, last.alerts),
            ("incidents held by the hub", first.incidents, last.incidents),
            ("batch ids remembered by the store", first.batch_ids, last.batch_ids),
            ("senders' ledger entries (bench only)", first.ledger, last.ledger),
        ]
        rows += [[what, f"{x:,}", f"{y:,}", f"{(y - x) / hours:+,.0f} / h"] for what, x, y in counts]
        print_table(
            f"where it goes, t={first.t:g} s → t={last.t:g} s",
            ["part", "at start", "at end", "per simulated hour"],
            rows,
        )
    print_table(
        "ru_maxrss of the process (what the 6-hour figure recorded)",
        ["when", "MiB"],
        [
            ["to the end of the run", f"{run.peak_rss_run_bytes / MIB:,.0f}"],
            ["after counting the store (bench verification)", f"{run.peak_rss_bytes / MIB:,.0f}"],
        ],
    )
    problems = run.mismatches()
    for problem in problems:
        console.print(f"MISMATCH {problem}")
    if feed is not None:
        console.print(f"VictoriaMetrics was fed {feed.samples:,} samples")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
