"""The serving hub's garbage collector: start-up's objects frozen, young collections rarer.

CPython's cycle collector runs a young collection every 700 container objects allocated (net) and
then, now and again, a full one over every tracked object in the process. A serving hub holds
hundreds of thousands of objects that live as long as it does (modules, classes, functions,
numpy's, DuckDB's and Starlette's state, the detectors' warmed-up state) and makes almost no
cyclic garbage: on agents' traffic (bench/bench_hub_cpu.py, 64 agents) its collector ran about
three young collections a second and a full one every half-minute or so (55–70 ms each), about
4 % of its CPU, and freed a few hundred objects a minute.

So once it has started (warm-up done, before it serves), the hub collects once and freezes what is
left (:func:`gc.freeze`: never scanned again), and young collections wait for
:data:`YOUNG_THRESHOLD` objects, so that a request's objects, alive for a few milliseconds, die
before a collection would promote them (promoted objects are what triggers full collections).
Cyclic garbage made later is still collected: frozen objects are only those alive at start.
"""

from __future__ import annotations

import gc

#: container objects allocated (net) between two young collections (CPython: 700); a tick of 1,024
#: agents' requests stays far below it, and at most this many objects of garbage wait
YOUNG_THRESHOLD = 20_000


def tune_for_serving() -> int:
    """Collect, freeze every object alive now, and make young collections rarer; returns how many
    objects are frozen. Call it once, when start-up is over and before the hub serves."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return gc.get_freeze_count()
