"""(d) Soak: is a real hub's memory flat over hours of real-time fleet traffic?

One ``gpuscope hub`` process on the embedded DuckDB store takes the load generator's traffic (one
batch per node per second, training SDK traffic, the default faults) in real time. Every 10 s the
hub's RSS is sampled. The figure is the growth of RSS after the first 10 minutes (the store's
caches, detector baselines and DuckDB's buffer pool fill during warm-up): max RSS afterwards over
the RSS at 10 minutes. Budget (issue 13, d): growth <= 10 %.

Anchor, same run: VictoriaMetrics ingesting the same node samples at 1 Hz (Prometheus text, its
import API), sampled the same way: what a store that users trust does with the same load.

The raw figure is decided by single samples (one 10-s sample at 10 minutes, the highest one
after it: an upkeep's spike of a second or two moves either by 20-60 MiB), so the bench prints the
level's growth beside it, for the hub and the anchor alike: the medians and the minima of each
5-minute window after warm-up, the highest later window against the first (10-15 minutes).

Every minute the bench also reads the hub's own ``/metrics`` for where its memory is: DuckDB's
``duckdb_memory()`` by tag, the Python heap (allocated blocks), glibc malloc (in use, free inside
the arenas, mapped) and the entries of the hub's bounded structures; a table every 10 minutes
shows which part grows.

usage: python bench/bench_soak.py [--duration 7200] [--nodes 64] [--json-out FILE] [--hub-arg=--x]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from common import Pacer, console, gpuscope_hub, print_table, prometheus_bodies, victoria_metrics
from gpuscope import hubmem
from gpuscope.loadgen import FleetShape, LoadOptions, run_load

SAMPLE_S = 10.0
#: how long the hub may take to answer at start: on a loaded shared machine 30 s was not enough
READY_S = 180.0
PROBE_S = 60.0
WARM_S = 600.0
#: A second, separately named figure: growth after 20 minutes, once the detectors' 15-minute
#: windows are full and DuckDB's cache has reached ``storage.cache_limit`` (the issue's figure,
#: after ``WARM_S``, stays the one that counts)
FULL_S = 1200.0
#: the window of the per-window minimum and maximum RSS
WINDOW_S = 300.0
MIB = 2**20
#: the hub's self-metrics (gpuscope.web.selfmetrics) the memory probe keeps: family -> label
MEMORY_FAMILIES = {
    "gpuscope_hub_process_resident_bytes": "",
    "gpuscope_hub_store_memory_bytes": "tag",
    "gpuscope_hub_store_allocator_bytes": "state",
    "gpuscope_hub_process_python_blocks": "",
    "gpuscope_hub_process_malloc_bytes": "state",
    "gpuscope_hub_structure_entries": "structure",
    "gpuscope_hub_store_batch_ids_remembered": "",
    "gpuscope_hub_process_pymalloc_bytes": "state",
    "gpuscope_hub_process_threads": "",
}
#: owner -> short column name, for the table of who owns the hub's resident set
OWNER_COLUMNS = {
    "file": "files",
    "file_data": "libs' data",
    "glibc_heap": "glibc heaps",
    "thread_stacks": "thread stacks",
    "other_anonymous": "own mappings",
}


def smaps_rollup(pid: int) -> dict[str, float]:
    """Anonymous and file-backed resident bytes of one process (``/proc/PID/smaps_rollup``): a
    rise in file pages is code and libraries touched for the first time, not the heap."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = float(rest.split()[0]) * 1024
    anon = fields.get("Anonymous", 0.0)
    return {"anon": anon, "file": fields.get("Rss", 0.0) - anon}


def parse_memory(text: str) -> dict[str, float]:
    """``family`` or ``family/label-value`` -> value, for the families in :data:`MEMORY_FAMILIES`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        family, _, labels = name.partition("{")
        if family not in MEMORY_FAMILIES:
            continue
        key = family
        if labels:
            key += "/" + labels.split('"')[1]
        out[key] = float(value)
    return out


class MemoryProbe(threading.Thread):
    """The hub's memory by part (its ``/metrics``) every ``PROBE_S`` seconds, and its resident set
    by owner (``/proc/PID/smaps``, sorted by :mod:`gpuscope.hubmem`) at the same moment."""

    def __init__(self, url: str, pid: int) -> None:
        super().__init__(daemon=True, name="memory-probe")
        self.url = url + "/metrics"
        self.pid = pid
        self.t0 = time.monotonic()
        self.rows: list[dict[str, float]] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._halt.is_set():
                try:
                    reply = client.get(self.url)
                    reply.raise_for_status()
                    maps = hubmem.read_smaps(self.pid) or []
                    owners = {f"owner/{k}": float(v) for k, v in hubmem.resident_by_owner(maps).items()}
                    row = {"t": time.monotonic() - self.t0, **parse_memory(reply.text), **owners}
                    self.rows.append(row)
                    console.print("  ".join(f"{c} {v}" for c, v in zip(*self.owner_row(row), strict=True)))
                except httpx.HTTPError:
                    self.errors += 1
                self._halt.wait(PROBE_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def owner_row(self, row: dict[str, float]) -> tuple[list[str], list[str]]:
        """Who owns the RSS at one probe: each owner's resident MiB, and inside the hub's own
        mappings what the allocators that map them say they hold (DuckDB's jemalloc resident,
        pymalloc's arenas, glibc's large blocks); ``rest`` is what none of them accounts for."""
        mib = {k[len("owner/") :]: v / MIB for k, v in row.items() if k.startswith("owner/")}
        jemalloc = row.get("gpuscope_hub_store_allocator_bytes/resident", 0.0) / MIB
        pymalloc = row.get("gpuscope_hub_process_pymalloc_bytes/arenas", 0.0) / MIB
        mapped = row.get("gpuscope_hub_process_malloc_bytes/mmap", 0.0) / MIB
        rest = mib.get("other_anonymous", 0.0) - jemalloc - pymalloc - mapped
        columns = [
            "min",
            "RSS",
            *OWNER_COLUMNS.values(),
            "threads",
            "malloc in use / free",
            "jemalloc res.",
            "pymalloc arenas / in use",
            "glibc mmap",
            "rest",
        ]
        values = [
            f"{row['t'] / 60:.0f}",
            f"{row.get('gpuscope_hub_process_resident_bytes', 0) / MIB:.0f}",
            *(f"{mib.get(k, 0.0):.0f}" for k in OWNER_COLUMNS),
            f"{row.get('gpuscope_hub_process_threads', 0):.0f}",
            f"{row.get('gpuscope_hub_process_malloc_bytes/in_use', 0) / MIB:.0f}"
            f" / {row.get('gpuscope_hub_process_malloc_bytes/free', 0) / MIB:.0f}",
            f"{jemalloc:.0f}",
            f"{pymalloc:.0f} / {row.get('gpuscope_hub_process_pymalloc_bytes/in_use', 0) / MIB:.0f}",
            f"{mapped:.0f}",
            f"{rest:.0f}",
        ]
        return columns, values

    def owner_table(self, every_s: float = 300.0) -> tuple[list[str], list[list[str]]]:
        """:meth:`owner_row` every ``every_s``, and at the last probe."""
        rows: list[list[str]] = []
        columns: list[str] = []
        next_t = 0.0
        for row in self.rows:
            if row["t"] + PROBE_S / 2 < next_t and row is not self.rows[-1]:
                continue
            next_t = row["t"] + every_s
            columns, values = self.owner_row(row)
            rows.append(values)
        return columns, rows

    def table(self, every_s: float = 600.0) -> tuple[list[str], list[list[str]]]:
        """One row per ``every_s``: RSS, DuckDB (total and its largest tags), Python, malloc, and the
        structures that grew most over the run."""
        if not self.rows:
            return [], []
        first, last = self.rows[0], self.rows[-1]
        tags = sorted(
            (k for k in last if k.startswith("gpuscope_hub_store_memory_bytes/")), key=lambda k: -last[k]
        )[:3]
        grown = sorted(
            (k for k in last if k.startswith("gpuscope_hub_structure_entries/")),
            key=lambda k: -(last[k] - first.get(k, 0.0)),
        )[:3]
        columns = [
            "min",
            "RSS MiB",
            "DuckDB MiB",
            *(k.split("/")[1] + " MiB" for k in tags),
            "Python blocks k",
            "malloc in use MiB",
            "malloc free MiB",
            "malloc mmap MiB",
            *(k.split("/")[1] for k in grown),
        ]
        rows: list[list[str]] = []
        next_t = 0.0
        for row in self.rows:
            if row["t"] + PROBE_S / 2 < next_t and row is not last:
                continue
            next_t = row["t"] + every_s
            duck = sum(v for k, v in row.items() if k.startswith("gpuscope_hub_store_memory_bytes/"))
            rows.append(
                [
                    f"{row['t'] / 60:.0f}",
                    f"{row.get('gpuscope_hub_process_resident_bytes', 0) / MIB:,.0f}",
                    f"{duck / MIB:,.0f}",
                    *(f"{row.get(k, 0) / MIB:,.0f}" for k in tags),
                    f"{row.get('gpuscope_hub_process_python_blocks', 0) / 1000:,.0f}",
                    *(
                        f"{row.get('gpuscope_hub_process_malloc_bytes/' + s, 0) / MIB:,.0f}"
                        for s in ("in_use", "free", "mmap")
                    ),
                    *(f"{row.get(k, 0):,.0f}" for k in grown),
                ]
            )
        return columns, rows


class RssSeries(threading.Thread):
    """RSS of each named process (with its children) every ``SAMPLE_S`` seconds."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True, name="rss-series")
        self.pids = pids
        self.t0 = time.monotonic()
        self.rows: list[dict[str, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            row: dict[str, float] = {"t": time.monotonic() - self.t0}
            for name, pid in self.pids.items():
                try:
                    proc = psutil.Process(pid)
                    family = [proc, *proc.children(recursive=True)]
                    row[name] = float(sum(p.memory_info().rss for p in family))
                    row[f"{name}_cpu_s"] = sum(t.user + t.system for t in (p.cpu_times() for p in family))
                    split = smaps_rollup(pid)
                    row[f"{name}_anon"], row[f"{name}_file"] = split["anon"], split["file"]
                except (psutil.Error, OSError):
                    row[name] = float("nan")
                    row[f"{name}_cpu_s"] = float("nan")
            self.rows.append(row)
            self._halt.wait(SAMPLE_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def cpu_by_window(self, name: str, window_s: float = 1200.0) -> list[float]:
        """Cores used by ``name`` in each window: does its CPU for the same load grow with age?"""
        cores: list[float] = []
        start = self.rows[0] if self.rows else None
        for row in self.rows:
            if start is not None and row["t"] - start["t"] >= window_s:
                cores.append((row[f"{name}_cpu_s"] - start[f"{name}_cpu_s"]) / (row["t"] - start["t"]))
                start = row
        return cores

    def windows(self, name: str, window_s: float = WINDOW_S) -> list[dict[str, float]]:
        """Per ``window_s`` after warm-up: the lowest and highest RSS sampled, and the lowest
        anonymous and file-backed parts. The minima are the level between the minute's seal
        spikes: their rise is what a leak would show, the maxima are the spikes."""
        out: list[dict[str, float]] = []
        start = WARM_S
        while True:
            rows = [r for r in self.rows if start < r["t"] <= start + window_s and r[name] == r[name]]
            if not rows:
                return out
            out.append(
                {
                    "from_min": start / 60,
                    "min_mib": min(r[name] for r in rows) / MIB,
                    "median_mib": statistics.median(r[name] for r in rows) / MIB,
                    "max_mib": max(r[name] for r in rows) / MIB,
                    "anon_min_mib": min(r.get(f"{name}_anon", 0.0) for r in rows) / MIB,
                    "file_min_mib": min(r.get(f"{name}_file", 0.0) for r in rows) / MIB,
                }
            )
            start += window_s

    def windowed_growth(self, name: str) -> dict[str, float]:
        """Growth judged on the level, not on single samples: the per-window medians and minima
        after warm-up, the highest later window against the first (10-15 minutes). One 10-s
        sample caught in an upkeep's spike decides the raw figure (:meth:`growth`); a window's
        median or minimum moves only when the level does."""
        windows = self.windows(name)
        if not windows:
            return {}
        first = windows[0]
        top_median = max(w["median_mib"] for w in windows)
        top_min = max(w["min_mib"] for w in windows)
        return {
            "median_first_mib": first["median_mib"],
            "median_highest_mib": top_median,
            "median_last_mib": windows[-1]["median_mib"],
            "median_growth_pct": (top_median / first["median_mib"] - 1) * 100,
            "min_first_mib": first["min_mib"],
            "min_highest_mib": top_min,
            "min_growth_pct": (top_min / first["min_mib"] - 1) * 100,
        }

    def growth(self, name: str, warm_s: float = WARM_S) -> dict[str, float]:
        """RSS at the end of warm-up, max afterwards, end; growth in % of the warm-up RSS; and the
        median and 95th percentile of RSS afterwards (a peak of a second or two beside the level)."""
        warm = [r[name] for r in self.rows if r["t"] <= warm_s] or [self.rows[0][name]]
        after = sorted(r[name] for r in self.rows if r["t"] > warm_s) or [warm[-1]]
        base = warm[-1]
        return {
            "rss_at_warmup_mib": base / 2**20,
            "rss_max_after_mib": after[-1] / 2**20,
            "rss_end_mib": self.rows[-1][name] / 2**20,
            "rss_p50_after_mib": after[len(after) // 2] / 2**20,
            "rss_p95_after_mib": after[min(len(after) - 1, int(len(after) * 0.95))] / 2**20,
            "growth_pct": (after[-1] / base - 1) * 100,
        }


def windowed_text(w: dict[str, float], part: str) -> str:
    """One of :meth:`RssSeries.windowed_growth`'s figures (``part``: median or min) as a cell."""
    if not w:
        return "-"
    first, top = w[f"{part}_first_mib"], w[f"{part}_highest_mib"]
    return f"{w[f'{part}_growth_pct']:+.1f} % ({first:,.0f} -> {top:,.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=7200, help="seconds of load (7200)")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--json-out", type=Path, default=None, help="also write figures and series here")
    ap.add_argument(
        "--hub-arg", action="append", default=[], help="an argument for `gpuscope hub` (repeatable)"
    )
    args = ap.parse_args()
    shape = FleetShape(nodes=args.nodes)
    console.print(f"soak: {args.nodes} nodes x 8 GPUs for {args.duration:g} s; load {os.getloadavg()}")
    bodies = prometheus_bodies(shape, 10)
    with (
        tempfile.TemporaryDirectory() as tmp,
        gpuscope_hub(Path(tmp) / "soak.duckdb", args.hub_arg, ready_s=READY_S) as (url, proc),
        victoria_metrics() as vm,
    ):
        pids = {"hub": proc.pid}
        anchor: Pacer | None = None
        if vm is not None:
            pids["victoriametrics"] = next(
                p.pid
                for p in psutil.process_iter(["cmdline"])
                if any(str(vm[1]) in arg for arg in p.info["cmdline"] or [])
            )
            anchor = Pacer(vm[0] + "/api/v1/import/prometheus", bodies, args.duration)
            anchor.start()
        series = RssSeries(pids)
        series.start()
        probe = MemoryProbe(url, proc.pid)
        probe.start()
        report = run_load(
            LoadOptions(hubs=[url], shape=shape, duration=args.duration, hub_pids=[proc.pid]),
            say=console.print,
        )
        series.stop()
        probe.stop()
        if anchor is not None:
            anchor.join(timeout=60)
    errors = anchor.errors if anchor is not None else 0
    figures = {name: series.growth(name) for name in pids}
    full = {name: series.growth(name, FULL_S) for name in pids}
    level = {name: series.windowed_growth(name) for name in pids}

    rows = [
        [
            name,
            f"{f['rss_at_warmup_mib']:,.0f}",
            f"{f['rss_max_after_mib']:,.0f}",
            f"{f['rss_end_mib']:,.0f}",
            f"{f['growth_pct']:+.1f} %",
            windowed_text(level[name], "median"),
            windowed_text(level[name], "min"),
            f"{f['rss_p50_after_mib']:,.0f} / {f['rss_p95_after_mib']:,.0f}",
            f"{full[name]['growth_pct']:+.1f} % (from {full[name]['rss_at_warmup_mib']:,.0f})",
            "budget <= 10 %" if name == "hub" else f"anchor, same samples (errors {errors})",
        ]
        for name, f in figures.items()
    ]
    load0, load1 = report.load_average
    print_table(
        f"soak, {args.nodes} nodes, {args.duration:g} s, load {load0:.1f} -> {load1:.1f}",
        [
            "process",
            "RSS at 10 min MiB",
            "max after MiB",
            "end MiB",
            "growth, raw max (issue 13 d)",
            "growth, 5-min medians: first -> highest",
            "growth, 5-min minima: first -> highest",
            "p50 / p95 after MiB",
            "growth after 20 min (windows full)",
            "note",
        ],
        rows,
    )
    print_table(
        "cores used per 20-minute window (the same load throughout)",
        ["process", "cores per window"],
        [[name, "  ".join(f"{c:.3f}" for c in series.cpu_by_window(name))] for name in pids],
    )
    windows = {name: series.windows(name) for name in pids}
    print_table(
        "RSS per 5 minutes after warm-up: lowest / median / highest (MiB); the hub's lowest anonymous and "
        "file-backed",
        ["from min", *pids, "hub anon / file"],
        [
            [
                f"{w['from_min']:.0f}",
                *(
                    f"{windows[n][i]['min_mib']:,.0f} / {windows[n][i]['median_mib']:,.0f} / "
                    f"{windows[n][i]['max_mib']:,.0f}"
                    for n in pids
                ),
                f"{w['anon_min_mib']:,.0f} / {w['file_min_mib']:,.0f}",
            ]
            for i, w in enumerate(windows["hub"])
            if all(i < len(windows[n]) for n in pids)
        ],
    )
    columns, memory_rows = probe.table()
    title = f"where the hub's memory is, every 10 minutes (probe errors {probe.errors})"
    print_table(title, columns, memory_rows)
    columns, owner_rows = probe.owner_table()
    print_table(
        "who owns the hub's resident set, MiB, every 5 minutes (smaps and /metrics)", columns, owner_rows
    )
    print_table("load", ["figure", "value", "note"], report.rows())
    if args.json_out:
        out = {
            "figures": figures,
            "figures_after_20_min": full,
            "windowed_growth": level,
            "cores_per_20_min": {name: series.cpu_by_window(name) for name in pids},
            "windows_5_min": windows,
            "series": series.rows,
            "memory": probe.rows,
            "load": report.to_dict(),
        }
        args.json_out.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
