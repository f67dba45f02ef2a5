"""(d) What the productivity model holds over hours of the soak's traffic, in virtual time.

The load generator's fleet (``--nodes`` nodes, the default faults, the soak's ring) goes through a
:class:`~gpuscope.productivity.ProductivityModel` alone, as the hub feeds it: every batch
observed, ``advance`` every second, the minute cells taken for saving every minute. Every
``--every`` virtual seconds the model's objects are walked (``gc.get_referents``, each object once,
``sys.getsizeof``) and its bytes printed by part: the ledger's minute buckets, its hour buckets, the
slot cache beyond what the ledger already holds, and the rest (GPU and job views, holders), beside
the entries the hub's ``/metrics`` shows (``gpuscope_hub_structure_entries{structure=
"productivity"}``). A tree's ``src`` given with ``PYTHONPATH`` is the model measured.

usage: python bench/bench_productivity_memory.py [--nodes 64] [--hours 2.5] [--every 600]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import types
from collections import Counter

from common import console, print_table
from gpuscope import procmem
from gpuscope.ingest.frame import CONTENT_TYPE, decode_body
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.productivity import ProductivityModel

MIB = 2**20
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)


def walked_bytes(root: object, seen: set[int]) -> int:
    """Bytes of the objects reachable from ``root`` not in ``seen`` (which it extends); classes,
    modules and functions are not counted (shared by the whole process)."""
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def parts(model: ProductivityModel) -> dict[str, int]:
    seen: set[int] = set()
    out = {
        "ledger minutes": walked_bytes(model.ledger.minutes, seen),
        "ledger hours": walked_bytes(model.ledger.hours, seen),
        "slot cache": walked_bytes(model._slots, seen),
    }
    out["the rest"] = walked_bytes(model, seen)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=2.5, help="virtual hours of traffic")
    ap.add_argument("--every", type=int, default=600, help="virtual seconds between readings")
    args = ap.parse_args()
    duration = args.hours * 3600.0
    load0 = os.getloadavg()[0]
    playback = Playback(scenario_doc(FleetShape(nodes=args.nodes), duration), 30, 60)
    model = ProductivityModel()
    rows: list[list[str]] = []
    c0 = time.process_time()
    t0 = 1_764_000_000.0  # an hour's start, as a live hub's clock would be anywhere
    for t, outs in playback.ticks(t0):
        for o in outs:
            model.observe(decode_body(CONTENT_TYPE, o.body))
        model.advance(t, [])
        elapsed = round(t - t0)
        if elapsed % 60 == 0:
            model.ledger.unsaved()  # what the hub's save takes once a minute
        if elapsed % args.every == 0:
            sizes = parts(model)
            cells = sum(len(b) for b in model.ledger.minutes.values())
            rows.append(
                [
                    f"{elapsed / 60:.0f}",
                    *(f"{v / MIB:.2f}" for v in sizes.values()),
                    f"{sum(sizes.values()) / MIB:.2f}",
                    f"{cells:,}",
                    f"{len(model._slots):,}",
                    f"{procmem.entries(model):,}",
                ]
            )
            console.print(" ".join(rows[-1]))
    cpu = time.process_time() - c0
    causes = Counter(slot.cause for slot in model._slots.values())
    console.print(
        f"slot cache: {len(model._slots):,} slots for {len(model.gpus):,} GPUs; by cause: "
        + ", ".join(f"{cause} {n:,}" for cause, n in causes.most_common())
    )
    print_table(
        f"productivity model bytes (MiB) by part, {args.nodes} nodes, {args.hours:g} virtual hours, "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {cpu:.0f} CPU-s",
        [
            "minute",
            *parts(ProductivityModel()),
            "total",
            "minute cells",
            "slots cached",
            "entries (/metrics)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
