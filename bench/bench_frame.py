"""Decoding an agent's batch: the binary frame against JSON, the anchor, on the same batches in the
same run.

The batches are the load generator's (the simulator's node batches: 8 GPUs × 45 metrics plus 15
node metrics, 375 values; and the training SDKs' batches of step records and heartbeats). Each
path is what the hub's ingest route runs before storing (``decode_body``: bytes to a validated
``Batch``) and what a sender runs to make the body. Passes alternate between the two paths and the
best pass of each is kept, so that other work on a shared machine weighs on both alike.

usage: python bench/bench_frame.py [--nodes 64] [--ticks 5] [--passes 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from common import console, print_table
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body, encode_frame
from gpuscope.ingest.payload import encode_batch
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch
from gpuscope.sim.cluster import Simulator


def batches(nodes: int, ticks: int) -> tuple[list[Batch], list[Batch]]:
    sim = Simulator(build_scenario(FleetShape(nodes=nodes), 60 + ticks, faults=[]), t0=time.time() - 120)
    node: list[Batch] = []
    sdk: list[Batch] = []
    for k, tick in enumerate(sim.ticks()):
        if k >= 40:  # past the jobs' start-up: step records flow
            node.extend(tick.node_batches.values())
            sdk.extend(b for b in tick.sdk_batches if b.training)
        if k >= 40 + ticks:
            break
    return node, sdk


def best(passes: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(passes):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def measure(name: str, group: list[Batch], passes: int) -> list[list[str]]:
    json_bodies = [encode_batch(b) for b in group]
    frame_bodies = [encode_frame(b) for b in group]
    n = len(group)
    cost: dict[str, list[float]] = {"json": [], "frame": []}
    enc: dict[str, list[float]] = {"json": [], "frame": []}
    for _ in range(passes):
        cost["json"].append(best(1, lambda: [decode_body("application/json", b) for b in json_bodies]))
        cost["frame"].append(best(1, lambda: [decode_body(CONTENT_TYPE, b) for b in frame_bodies]))
        enc["json"].append(best(1, lambda: [encode_batch(b) for b in group]))
        enc["frame"].append(best(1, lambda: [encode_frame(b) for b in group]))
    size = {"json": sum(map(len, json_bodies)) / n, "frame": sum(map(len, frame_bodies)) / n}
    rows = []
    for path, label in (("json", "JSON (anchor)"), ("frame", "binary frame")):
        d, e = min(cost[path]) / n * 1e3, min(enc[path]) / n * 1e3
        ratio = min(cost["json"]) / min(cost[path])
        rows.append([name, label, f"{size[path]:,.0f}", f"{d:.3f}", f"{ratio:.2f}×", f"{e:.3f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    node, sdk = batches(args.nodes, args.ticks)
    load = os.getloadavg()[0]
    rows = measure(f"node batch ({len(node)})", node, args.passes)
    if sdk:
        rows += measure(f"SDK batch ({len(sdk)})", sdk, args.passes)
    print_table(
        f"decode_body per batch, best of {args.passes} passes, "
        f"load average {load:.1f} → {os.getloadavg()[0]:.1f}",
        ["batches", "wire format", "bytes/batch", "decode ms/batch", "decode speed-up", "encode ms/batch"],
        rows,
    )
    console.print("decode = bytes to a validated Batch (the hub's route); encode = Batch to bytes (a sender)")


if __name__ == "__main__":
    main()
