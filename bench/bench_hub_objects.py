"""(d) Which Python objects a hub gains between two moments of the soak's traffic, in virtual time.

A hub in this process (:func:`gpuscope.runtime.evaluation_hub` on a durable DuckDB store in a
temporary directory) takes the load generator's fleet (``--nodes`` nodes, the default faults of a
``--minutes``-long run, the soak's ring) as fast as it can: each tick's batches ingested, one
evaluation a tick, the upkeep (``Hub.maintain``, which saves the productivity model's cells) every
minute. At ``--at`` virtual minutes (two or more) every object the collector tracks is counted by
type, with its ``sys.getsizeof`` bytes; the types that gained most between the first and the last
reading are printed, beside the hub's structure entries (what ``/metrics`` shows). Objects the
collector does not track (floats, strings, arrays' buffers) show through their holders' counts.

usage: python bench/bench_hub_objects.py [--nodes 16] [--minutes 45] [--at 10 --at 40]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import console, print_table
from gpuscope import procmem
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.runtime import evaluation_hub
from gpuscope.store.duckdb import DuckDBStore

MIB = 2**20


def census() -> tuple[Counter[str], Counter[str]]:
    """Objects the collector tracks, counted and sized by type (and the containers' direct
    untracked members: a dict's floats and strings, a list's floats)."""
    gc.collect()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    return counts, sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--minutes", type=int, default=45, help="virtual minutes of traffic")
    ap.add_argument("--at", type=int, action="append", default=[], help="virtual minute of a reading")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    at = sorted(args.at or [10, 40])
    load0 = os.getloadavg()[0]
    playback = Playback(scenario_doc(FleetShape(nodes=args.nodes), args.minutes * 60.0), 30, 60)
    readings: dict[int, tuple[Counter[str], Counter[str], dict[str, int]]] = {}
    c0 = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        store = DuckDBStore(str(Path(tmp) / "objects.duckdb"))
        try:
            hub = evaluation_hub(store, 2.5)
            t0 = float(int(time.time() // 3600 * 3600))  # on an hour, as the soak's clock would be somewhere
            hub.resume(t0)
            for t, outs in playback.ticks(t0):
                for o in outs:
                    hub.ingest(decode_body(CONTENT_TYPE, o.body))
                hub.evaluate(t)
                elapsed = round(t - t0)
                if elapsed % 60 == 0:
                    hub.maintain(t)
                    if elapsed // 60 in at:
                        counts, sizes = census()
                        entries = {k: procmem.entries(v) for k, v in hub.structures().items()}
                        readings[elapsed // 60] = (counts, sizes, entries)
                        console.print(f"minute {elapsed // 60}: {sum(sizes.values()) / MIB:.1f} MiB tracked")
        finally:
            store.close()
    cpu = time.process_time() - c0
    first, last = readings[min(readings)], readings[max(readings)]
    grown = sorted(last[1], key=lambda k: last[1][k] - first[1].get(k, 0), reverse=True)[: args.top]
    print_table(
        f"objects gained from virtual minute {min(readings)} to {max(readings)}, {args.nodes} nodes, "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {cpu:.0f} CPU-s",
        ["type", "count", "count gained", "KiB", "KiB gained"],
        [
            [
                name,
                f"{last[0][name]:,}",
                f"{last[0][name] - first[0].get(name, 0):+,}",
                f"{last[1][name] / 1024:,.0f}",
                f"{(last[1][name] - first[1].get(name, 0)) / 1024:+,.0f}",
            ]
            for name in grown
        ],
    )
    print_table(
        "structure entries (gpuscope_hub_structure_entries)",
        ["structure", *(f"minute {m}" for m in sorted(readings))],
        [[k, *(f"{readings[m][2][k]:,}" for m in sorted(readings))] for k in sorted(last[2])],
    )


if __name__ == "__main__":
    main()
