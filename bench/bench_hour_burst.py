"""(d) The soak's step: which of a hub's once-in-a-while jobs leaves pymalloc's arenas larger?

The 2-hour soak of 85490c5 (docs/scaling.md (d)) held RSS flat but for one step: pymalloc's
arenas 77 -> 104 MiB between minutes 60 and 61, with the objects in them unchanged. A burst of
small Python objects built while the hub went on allocating: the arenas that burst filled stay as
long as anything allocated beside it lives (CPython frees a 1-MiB arena only when every block in it
is free). Two suspects ran near minute 60: the hour's upkeep (the last piece sealed, the hour's
pieces merged, the hour's rollup: what runs once an hour) and the ``training_stalled`` playbook of
the load generator's ``training_hang`` fault, which it plays at half the run (minute 60 of 120;
minute 25 of the 50-minute soak, whose arenas stepped at minute 26).

This bench drives both directly, in a fresh process each, on a store filled as the soak's hub
fills it (the load generator's 64-node fleet: an hour of raw rows sealed minute by minute with the
last minute still hot, and an hour of its four 128-rank jobs' training records), with the hub's
malloc settings and its collector frozen, while a thread allocates beside them as a serving hub
does: small objects at a steady rate, each kept for ``--keep`` seconds, one in ``--forever``
kept for good (state that lives on). A sampler reads pymalloc's arenas and bytes in use every
50 ms (hubmem). Per job: the arenas before, their peak, and what is left ``--settle`` seconds
after it (the beside objects of the burst's time by then dead but the ``forever`` ones), and the
same for the bytes in use. ``--src`` runs the same bench on other source trees (e.g. main's,
exported with ``git archive``), alternated with this one, one fresh process each.

usage: python bench/bench_hour_burst.py [--nodes 64] [--pairs 3] [--src other/src]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, console, print_table
from gpuscope import gcpolicy, hubmem, procmem
from gpuscope.alert.checks import Reads
from gpuscope.alert.triage import run_playbook
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.model import Alert
from gpuscope.store.duckdb import DuckDBStore

MIB = 2**20
WINDOW_S = 60
HOUR_S = 3600
SAMPLE_S = 0.05
DB = "hour.duckdb"


def columns(store: DuckDBStore, table: str) -> list[str]:
    con = store._con.cursor()
    try:
        return [str(r[0]) for r in con.execute(f"DESCRIBE {table}").fetchall()]
    finally:
        con.close()


def forward(store: DuckDBStore, table: str, window: str, first: int, last: int) -> None:
    """``window``'s rows copied forward by ``first`` .. ``last`` - 1 minutes into ``table``
    (training steps moved on with the time)."""
    moved = {"ts": f"ts + k * {WINDOW_S * 1000 if table == 'samples' else WINDOW_S}", "step": "step + k * 60"}
    cols = columns(store, table)
    select = ", ".join(moved.get(c, c) if table == "training" or c == "ts" else c for c in cols)
    con = store._con.cursor()
    try:
        con.execute(
            f"INSERT INTO {table} ({', '.join(cols)}) "
            f"SELECT {select} FROM {window}, range({first}, {last}) r(k)"
        )
    finally:
        con.close()


def prepare(directory: Path, nodes: int) -> dict[str, Any]:
    """A store at the end of an hour of ``nodes`` nodes' traffic: 59 minutes sealed minute by
    minute, the last one hot; an hour of training records."""
    procmem.limit_arenas(2)
    procmem.fix_mmap_threshold()
    hour = (int(time.time()) // HOUR_S - 3) * HOUR_S
    playback = Playback(scenario_doc(FleetShape(nodes=nodes), WINDOW_S, faults=[]), 30, 60)
    store = DuckDBStore(str(directory / DB), memory_limit="256MB", seal_interval_s=WINDOW_S)
    try:
        for _, outs in playback.ticks(hour):
            for o in outs:
                store.append(decode_body(CONTENT_TYPE, o.body))
        store.stats()  # the acknowledged rows reach the tables
        con = store._con.cursor()
        con.execute(f"CREATE TABLE bench_window AS SELECT * FROM samples WHERE ts < {(hour + 60) * 1000}")
        con.execute(f"CREATE TABLE bench_training AS SELECT * FROM training WHERE ts < {hour + 60}")
        con.execute("DELETE FROM training")
        con.close()
        forward(store, "training", "bench_training", 0, HOUR_S // WINDOW_S)
        for k in range(HOUR_S // WINDOW_S):
            if k:
                forward(store, "samples", "bench_window", k, k + 1)
            store.rollup(hour + (k + 1) * WINDOW_S)
            if k < HOUR_S // WINDOW_S - 1:  # the last minute stays hot: the measured upkeep seals it
                store.rollup(hour + (k + 1) * WINDOW_S + 2 * WINDOW_S)
                store.compact(hour + (k + 1) * WINDOW_S + 2 * WINDOW_S)
        con = store._con.cursor()
        con.execute("DROP TABLE bench_window")
        con.execute("DROP TABLE bench_training")
        con.close()
        stats = store.stats()
    finally:
        store.close()
    return {"hour": hour, "chunk_files": stats["chunk_files"], "training": stats["rows"]["training"]}


class Beside(threading.Thread):
    """A serving hub's own allocation: small objects at ``rate`` a second, each kept ``keep_s``
    seconds, one in ``forever`` kept for good."""

    def __init__(self, rate: int, keep_s: float, forever: int) -> None:
        super().__init__(daemon=True, name="beside")
        self.rate, self.forever = rate, forever
        self.recent: collections.deque[dict[str, float]] = collections.deque(maxlen=int(rate * keep_s))
        self.kept: list[dict[str, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        n, tick = 0, 0.01
        while not self._halt.wait(tick):
            for _ in range(int(self.rate * tick)):
                obj = {"ts": time.time(), "value": float(n)}
                self.recent.append(obj)
                if n % self.forever == 0:
                    self.kept.append(obj)
                n += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Sampler(threading.Thread):
    """pymalloc's arenas and bytes in use, every ``SAMPLE_S``: their peaks since :meth:`reset`."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="pymalloc-sampler")
        self.peak_arenas = self.peak_in_use = 0
        self._halt = threading.Event()

    def read(self) -> tuple[int, int]:
        p = hubmem.pymalloc()
        if p is None:
            raise SystemExit("pymalloc's statistics are not available here (PYTHONMALLOC=malloc?)")
        return p.arena_bytes, p.in_use_bytes

    def reset(self) -> None:
        self.peak_arenas, self.peak_in_use = self.read()

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_S):
            arenas, in_use = self.read()
            self.peak_arenas, self.peak_in_use = max(self.peak_arenas, arenas), max(self.peak_in_use, in_use)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def measure(sampler: Sampler, job: Any, settle_s: float) -> dict[str, float]:
    gc.collect()
    before = sampler.read()
    sampler.reset()
    started, cpu0 = time.perf_counter(), time.process_time()
    result = job()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    peak = sampler.peak_arenas, sampler.peak_in_use
    time.sleep(settle_s)
    gc.collect()
    after = sampler.read()
    return {
        "arenas_before": before[0] / MIB,
        "arenas_peak": peak[0] / MIB,
        "arenas_after": after[0] / MIB,
        "in_use_before": before[1] / MIB,
        "in_use_peak": peak[1] / MIB,
        "in_use_after": after[1] / MIB,
        "seconds": seconds,
        "cpu_s": cpu,
        "result": json.dumps(result, sort_keys=True, default=str)[:4000],
    }


def one_run(prepared: Path, hour: int, args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: a copy of the prepared store; the hour's upkeep, then the playbook."""
    procmem.limit_arenas(2)
    procmem.fix_mmap_threshold()
    now = float(hour + HOUR_S)
    with tempfile.TemporaryDirectory() as tmp:
        for item in prepared.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy)(item, Path(tmp) / item.name)
        store = DuckDBStore(str(Path(tmp) / DB), memory_limit="256MB", seal_interval_s=WINDOW_S)
        try:
            store.stats()
            gcpolicy.tune_for_serving()
            sampler, beside = Sampler(), Beside(args.rate, args.keep, args.forever)
            sampler.start()
            beside.start()
            time.sleep(args.keep)  # the beside objects reach their steady count
            upkeep = measure(
                sampler,
                lambda: {**store.rollup(now + 2 * WINDOW_S), **store.compact(now + 2 * WINDOW_S)},
                args.settle,
            )
            alert = Alert("al-1", "training_stalled", "P1", "ml", {"job": args.job}, now, "stalled", 40.0)

            def playbook() -> dict[str, Any]:
                doc = run_playbook(alert, Reads(store), now, [alert])
                return {s["check"]: s["result"] for s in doc["diagnosis"] if "check" in s}

            stalled = measure(sampler, playbook, args.settle)
            beside.stop()
            sampler.stop()
        finally:
            store.close()
    return {"upkeep": upkeep, "playbook": stalled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3, help="runs of each tree, alternated")
    ap.add_argument("--src", action="append", default=[], help="another tree's src directory (repeatable)")
    ap.add_argument("--job", default="job-1", help="the stalled job (the load generator's: job-0 .. job-3)")
    ap.add_argument("--rate", type=int, default=2000, help="beside objects a second")
    ap.add_argument("--keep", type=float, default=20.0, help="seconds each beside object lives")
    ap.add_argument("--forever", type=int, default=50, help="one beside object in this many lives on")
    ap.add_argument("--settle", type=float, default=25.0, help="seconds after a job before its reading")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: "prepared-dir,hour"
    args = ap.parse_args()
    if args.one is not None:
        prepared, hour = args.one.split(",")
        print(json.dumps(one_run(Path(prepared), int(hour), args)))
        return
    trees = {"this tree": str(ROOT / "src"), **{src: src for src in args.src}}
    with tempfile.TemporaryDirectory() as tmp:
        console.print(f"preparing an hour of {args.nodes} nodes; load {os.getloadavg()[0]:.1f}")
        info = prepare(Path(tmp), args.nodes)
        console.print(f"prepared: {info}")
        rows: list[list[str]] = []
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for k in range(args.pairs):
            for name, src in reversed(trees.items()) if k % 2 else trees.items():
                load0 = os.getloadavg()[0]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(ROOT / "bench")])}
                child = subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], "--one", f"{tmp},{info['hour']}"],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                r = json.loads(child.stdout.strip().splitlines()[-1])
                results[name].append(r)
                load1 = os.getloadavg()[0]
                for job in ("upkeep", "playbook"):
                    m = r[job]
                    rows.append(
                        [
                            str(k + 1),
                            name,
                            "hour's upkeep (seal, merge, 1-h rollup)"
                            if job == "upkeep"
                            else "training_stalled playbook",
                            f"{m['arenas_before']:.0f} / {m['arenas_peak']:.0f} / {m['arenas_after']:.0f}",
                            f"{m['arenas_after'] - m['arenas_before']:+.0f}",
                            f"{m['in_use_before']:.0f} / {m['in_use_peak']:.0f} / {m['in_use_after']:.0f}",
                            f"{m['seconds']:.2f} / {m['cpu_s']:.2f}",
                            f"{load0:.1f} -> {load1:.1f}",
                        ]
                    )
                console.print(rows[-2], rows[-1])
        answers = {name: {r["playbook"]["result"] for r in rs} for name, rs in results.items()}
    print_table(
        f"the hour's jobs, {args.nodes} nodes, beside: {args.rate}/s kept {args.keep:g} s, 1 in "
        f"{args.forever} for good; readings {args.settle:g} s after (MiB)",
        [
            "pair",
            "tree",
            "job",
            "pymalloc arenas: before / peak / after",
            "arenas left",
            "in use: before / peak / after",
            "s / CPU-s",
            "load",
        ],
        rows,
    )
    same = len({a for v in answers.values() for a in v}) == 1
    console.print(f"playbook answers identical across trees and runs: {same}")
    if not same:
        for name, a in answers.items():
            console.print(name, sorted(a))


if __name__ == "__main__":
    main()
