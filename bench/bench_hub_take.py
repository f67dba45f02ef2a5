"""The hub process's part of a batch in worker mode (``hub.ingest_workers``), stage by stage.

An ingest worker writes each agent's frame (its record is the frame's bytes) into its own log and
acknowledges it; the hub process reads the log behind it (``LogTail``), decodes the record again,
hands it to the store (``DuckDBStore.take_logged``: batch-id claim, row preparation) and queues it
for the detectors (``Hub.taken``). This feeds the load generator's node batches (bench_hub_cpu's
traffic: 64 agents, about 351 samples a batch) through those four stages in one thread, the log
written beforehand as a worker would (``--per-pass`` records appended before each pass of the
reader: a worker's group commit holds one to a few of them at 64 agents), and times each stage in
thread CPU per batch. No HTTP, no commit (the store's flush thread, the evaluator and DuckDB's
threads are not in it), so the stages add up to the reader thread's own work only.

``--sdk`` adds the training jobs' batches as the load generator sends them (one a job a tick, each
with its ranks' heartbeats and step records in the frame's extras: 16 nodes a job, 8 ranks a node),
the traffic of ``bench_load.py`` that bench_hub_cpu's node batches leave out; the figures are then
also given per node batch (the fleet's cost over its node batches, as bench_load's per-batch
figures are). Anchor, same run: each record decoded again as the hub decoded it before the
ingest-log decode built the extras without their checks (``decode_frame`` with every check).

usage: python bench/bench_hub_take.py [--nodes 64] [--ticks 20] [--per-pass 2] [--sdk]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from common import console, print_table
from gpuscope import gcpolicy
from gpuscope.counters import Counters
from gpuscope.hub import Hub
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.ingest_log import IngestLog
from gpuscope.store.log_codec import TRUSTED, decode
from gpuscope.store.log_tail import LogTail


def _nothing(seq: int) -> None:
    pass


def bodies(nodes: int, ticks: int, sdk: bool = False) -> list[bytes]:
    """Each tick's node batches as frames, and with ``sdk`` its jobs' batches after them."""
    scenario = build_scenario(FleetShape(nodes=nodes), ticks + 5, faults=[])
    out: list[bytes] = []
    for k, tick in enumerate(Simulator(scenario, t0=time.time()).ticks()):
        if k == ticks:
            break
        out += [encode_frame(b) for b in tick.node_batches.values()]
        if sdk:
            out += [encode_frame(b) for b in tick.sdk_batches]
    return out


#: the store's commit interval here: the first ticks' new entities and columns are committed (and
#: the preparation's per-layout shortcut taken) before the measured ticks
FLUSH_S = 0.2


def run(records: list[bytes], warm: int, per_pass: int) -> dict[str, float]:
    """Thread CPU seconds of each stage over ``records`` after the first ``warm``."""
    spent = dict.fromkeys(("log read", "decode", "store take (claim, prepare)", "queue for detectors"), 0.0)
    spent[ANCHOR] = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        log = IngestLog(Path(tmp) / "log", Counters(), reserve_bytes=0)
        list(log.recover(0))
        log.start()
        store = DuckDBStore(str(Path(tmp) / "hub.duckdb"), flush_interval_s=FLUSH_S)
        hub = Hub(store)
        gcpolicy.tune_for_serving()  # the serving hub's collector settings (gpuscope hub sets them)
        tail = LogTail(Path(tmp) / "log", 0)
        clock = time.thread_time
        lap = dict.fromkeys(spent, 0.0)
        for start in range(0, len(records), per_pass):
            if start == warm:
                time.sleep(3 * FLUSH_S)  # committed: what the warm-up ticks registered is known
                lap = spent
            for body in records[start : start + per_pass]:
                log.append(body, _nothing)
            t0 = clock()
            taken = tail.read(log.synced, 256)
            t1 = clock()
            lap["log read"] += t1 - t0
            for seq, payload in taken:
                t0 = clock()
                batch = decode(payload)
                t1 = clock()
                result = store.take_logged(batch, 0, seq)
                t2 = clock()
                hub.taken(batch, result)
                t3 = clock()
                lap["decode"] += t1 - t0
                lap["store take (claim, prepare)"] += t2 - t1
                lap["queue for detectors"] += t3 - t2
                t0 = clock()
                decode_frame(payload, TRUSTED)  # the anchor: the same record with every check
                lap[ANCHOR] += clock() - t0
            if start % 640 == 0:
                hub.settle()  # the evaluator's part, off the clock: keeps the queue short
        tail.close()
        log.close()
        store.close()
    return spent


#: the anchor's row: the decode as it was before the ingest log's records were decoded unchecked
ANCHOR = "anchor: decode with every check (before)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--per-pass", type=int, default=2)
    ap.add_argument("--sdk", action="store_true", help="add the jobs' batches (bench_load's traffic)")
    a = ap.parse_args()
    records = bodies(a.nodes, a.ticks, a.sdk)
    per_tick = len(records) // a.ticks
    warm = per_tick * 3  # the first ticks register entities and columns: left out
    spent = run(records, warm, a.per_pass)
    n = len(records) - warm
    nodes = a.nodes * (a.ticks - 3)
    anchor = spent.pop(ANCHOR)
    rows = [[stage, f"{s * 1e3 / n:.3f}", f"{s * 1e3 / nodes:.3f}"] for stage, s in spent.items()]
    total = sum(spent.values())
    rows.append(["all four", f"{total * 1e3 / n:.3f}", f"{total * 1e3 / nodes:.3f}"])
    rows.append([ANCHOR, f"{anchor * 1e3 / n:.3f}", f"{anchor * 1e3 / nodes:.3f}"])
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print_table(
        f"hub process, reader thread ({n:,} batches, {nodes:,} of them node batches, {a.per_pass} a pass; "
        f"load average {load})",
        ["stage", "CPU ms/batch", "CPU ms/node batch"],
        rows,
    )
    console.print("thread CPU; no HTTP, commit, evaluation or DuckDB threads in it")


if __name__ == "__main__":
    main()
