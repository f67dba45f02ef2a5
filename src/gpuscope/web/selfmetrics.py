"""The hub's own ``/metrics`` in the Prometheus text format: what it ingested, refused, dropped,
how far behind its senders it is, what detection costs and how many notifications wait.

Counter names come from :class:`gpuscope.counters.Counters` (one home); this module only sorts
them into families: what was ingested, what was refused (bad input, auth, limits), and the rest.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuscope import __version__, hubmem, procmem
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.rules import NODE_UNREACHABLE, RANK_LOST

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INGESTED = {
    "ingest_batches": "batches",
    "ingest_samples": "samples",
    "ingest_events": "events",
    "ingest_training_records": "training_records",
}
_REFUSAL_WORDS = ("refused", "rejected", "rate_limited", "too_large")
#: the detectors' counts of silence verdicts given where the hub's lag would have withheld them, the
#: sender having stopped knocking too (:mod:`gpuscope.detect.liveness`): verdicts given, not withheld
FOUND_ON_WIRE = {"node_verdicts_found_on_wire": NODE_UNREACHABLE, "rank_verdicts_found_on_wire": RANK_LOST}


class IngestLag:
    """Seconds between the newest timestamp of each stored batch and the moment the hub observed
    it (its observe stage, a tick at once after it was stored: the age of what the detectors know)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.last: float | None = None
        self.max: float = 0.0

    def observe(self, batch: Batch) -> None:
        stamps = [f.ts for f in batch.frames] + [e.ts for e in batch.events] + [t.ts for t in batch.training]
        if not stamps:
            return
        lag = max(0.0, self.clock() - max(stamps))
        with self._lock:
            self.last = lag
            self.max = max(self.max, lag)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(float(value))


Rows = list[tuple[dict[str, str], float]]


@dataclass(frozen=True, slots=True)
class Reading:
    """Everything one exposition shows, read from the hub at one scrape."""

    uptime_s: float
    storage_ok: bool
    counters: dict[str, int]
    withheld: dict[str, int]  # what the detectors refused or withheld, by reason
    detect_seconds: float
    lag_last: float | None
    lag_max: float
    firing: int
    outbox: dict[str, int] | None
    store: dict[str, Any]
    memory: procmem.ProcessMemory
    structures: Rows
    #: the alerting service's triage queue (None: the hub runs none)
    triage: dict[str, float] | None = None


def read(
    hub: Hub,
    lag: IngestLag,
    uptime_s: float,
    storage_ok: bool,
    outbox_stats: Callable[[], dict[str, int]] | None = None,
    triage_stats: Callable[[], dict[str, float]] | None = None,
) -> Reading:
    """Reads the store's and the outbox's statistics (call it off the event loop)."""
    return Reading(
        uptime_s=uptime_s,
        storage_ok=storage_ok,
        counters=hub.counters.snapshot(),
        withheld=hub.detection_stats(),
        detect_seconds=hub.detect_seconds,
        lag_last=lag.last,
        lag_max=lag.max,
        firing=len(hub.firing()),
        outbox=outbox_stats() if outbox_stats is not None else None,
        triage=triage_stats() if triage_stats is not None else None,
        store=hub.store.stats(),
        memory=procmem.snapshot(),
        structures=procmem.structure_rows(hub.structures()),
    )


def _refused(counters: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counters.items() if k not in INGESTED and any(w in k for w in _REFUSAL_WORDS)}


def _other(counters: dict[str, int]) -> dict[str, int]:
    refused = _refused(counters)
    return {k: v for k, v in counters.items() if k not in INGESTED and k not in refused}


def _one(value: float) -> Rows:
    return [({}, value)]


def _by(label: str, values: object) -> Rows | None:
    """One row per entry of a mapping, sorted by key; None (no family) where ``values`` is none."""
    if not isinstance(values, dict):
        return None
    return [({label: str(k)}, float(v)) for k, v in sorted(values.items())]


def _pymalloc_rows(stats: hubmem.PyMalloc | None) -> Rows | None:
    if stats is None:
        return None
    return [
        ({"state": "arenas"}, float(stats.arena_bytes)),
        ({"state": "free"}, float(stats.free_bytes)),
        ({"state": "in_use"}, float(stats.in_use_bytes)),
    ]


def _store_scalar(key: str) -> Callable[[Reading], Rows | None]:
    def rows(r: Reading) -> Rows | None:
        value = r.store.get(key)
        return [({}, value)] if isinstance(value, int | float) and not isinstance(value, bool) else None

    return rows


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    kind: str
    text: str
    #: the family's samples; None leaves the family out (an empty list keeps its HELP and TYPE)
    rows: Callable[[Reading], Rows | None]


_MALLOC = {"in_use": "malloc_in_use_bytes", "free": "malloc_free_bytes", "mmap": "malloc_mmap_bytes"}

FAMILIES: tuple[_Family, ...] = (
    _Family(
        "gpuscope_hub_build_info", "gauge", "Version of the hub.", lambda r: [({"version": __version__}, 1)]
    ),
    _Family(
        "gpuscope_hub_uptime_seconds",
        "gauge",
        "Seconds since the hub's API started.",
        lambda r: _one(r.uptime_s),
    ),
    _Family(
        "gpuscope_hub_storage_up",
        "gauge",
        "1 while batches are stored, 0 while the store fails.",
        lambda r: _one(r.storage_ok),
    ),
    _Family(
        "gpuscope_hub_ingested_total",
        "counter",
        "What the hub stored: batches, samples, events and training records.",
        lambda r: [({"kind": kind}, r.counters.get(name, 0)) for name, kind in INGESTED.items()],
    ),
    _Family(
        "gpuscope_hub_refused_total",
        "counter",
        "Requests, batches or values refused, by reason (bad input, auth, limits); api_refused_N counts "
        "the HTTP answers, so it overlaps the other reasons.",
        lambda r: _by("reason", _refused(r.counters)),
    ),
    _Family(
        "gpuscope_hub_operations_total",
        "counter",
        "Every other counted event of the hub (drops, retries, notifications, warm-up), by name.",
        lambda r: _by("name", _other(r.counters)),
    ),
    _Family(
        "gpuscope_hub_detection_withheld_total",
        "counter",
        "What the detectors refused as malformed or withheld, by reason.",
        lambda r: _by("reason", {k: v for k, v in r.withheld.items() if k not in FOUND_ON_WIRE}),
    ),
    _Family(
        "gpuscope_hub_silence_verdicts_found_on_wire_total",
        "counter",
        "Silence verdicts given although a hub gap or late data would have withheld them, because the "
        "sender had stopped sending requests too (X-Gpuscope-Sender): found dead on the wire, by rule.",
        lambda r: [({"rule": rule}, r.withheld.get(name, 0)) for name, rule in FOUND_ON_WIRE.items()],
    ),
    _Family(
        "gpuscope_hub_detection_seconds_total",
        "counter",
        "Wall time spent in the detectors (the cost of detection).",
        lambda r: _one(r.detect_seconds),
    ),
    _Family(
        "gpuscope_hub_ingest_lag_seconds",
        "gauge",
        "Age of the newest timestamp of the last stored batch when the hub's detectors saw it "
        "(stored, then observed a tick at once; NaN before any).",
        lambda r: _one(math.nan if r.lag_last is None else r.lag_last),
    ),
    _Family(
        "gpuscope_hub_ingest_lag_max_seconds",
        "gauge",
        "Largest ingest lag seen since start.",
        lambda r: _one(r.lag_max),
    ),
    _Family("gpuscope_hub_firing_alerts", "gauge", "Alerts firing now.", lambda r: _one(r.firing)),
    _Family(
        "gpuscope_hub_outbox_notifications",
        "gauge",
        "Notifications in the outbox by state: pending (waiting or retried), delivered, dead.",
        lambda r: (
            None
            if r.outbox is None
            else [({"state": state}, r.outbox[state]) for state in ("pending", "delivered", "dead")]
        ),
    ),
    _Family(
        "gpuscope_hub_triage_queue_depth",
        "gauge",
        "Alert changes waiting for their playbook and dispatch (off the evaluator's thread).",
        lambda r: None if r.triage is None else _one(r.triage["depth"]),
    ),
    _Family(
        "gpuscope_hub_triage_oldest_wait_seconds",
        "gauge",
        "How long the oldest alert change waiting for triage has waited (0 when none waits).",
        lambda r: None if r.triage is None else _one(r.triage["oldest_wait_seconds"]),
    ),
    _Family(
        "gpuscope_hub_store_rows",
        "gauge",
        "Rows per table of the store.",
        lambda r: _by("table", r.store.get("rows")),
    ),
    _Family(
        "gpuscope_hub_store_memory_bytes",
        "gauge",
        "The embedded store's own memory accounting (DuckDB's duckdb_memory()), by tag.",
        lambda r: _by("tag", r.store.get("memory")),
    ),
    _Family(
        "gpuscope_hub_store_allocator_bytes",
        "gauge",
        "DuckDB's own jemalloc, by state: allocated, active, dirty (freed, not yet returned to the "
        "OS), muzzy, resident, mapped, retained, metadata. Absent where DuckDB does not offer them.",
        lambda r: _by("state", r.store.get("allocator")),
    ),
    *(
        _Family(
            f"gpuscope_hub_store_{key}", "gauge", f"The store's {key.replace('_', ' ')}.", _store_scalar(key)
        )
        for key in ("disk_bytes", "entities", "metrics", "batch_ids_remembered")
    ),
    # where the process's memory is: what grows over a soak (issue 13 (d)) shows up here
    _Family(
        "gpuscope_hub_process_resident_bytes",
        "gauge",
        "Resident set of the hub process.",
        lambda r: _one(r.memory.rss_bytes),
    ),
    _Family(
        "gpuscope_hub_process_python_blocks",
        "gauge",
        "Memory blocks the Python interpreter has allocated and not freed.",
        lambda r: _one(r.memory.python_blocks),
    ),
    _Family(
        "gpuscope_hub_process_gc_objects",
        "gauge",
        "Objects waiting for the garbage collector, by generation.",
        lambda r: [({"generation": str(g)}, n) for g, n in enumerate(r.memory.gc_tracked)],
    ),
    _Family(
        "gpuscope_hub_process_malloc_bytes",
        "gauge",
        "glibc malloc: bytes in use, free but kept inside the arenas, and mapped on their own.",
        lambda r: [
            ({"state": state}, value)
            for state, attr in _MALLOC.items()
            if (value := getattr(r.memory, attr)) is not None
        ],
    ),
    _Family(
        "gpuscope_hub_process_pymalloc_bytes",
        "gauge",
        "The Python interpreter's small-object allocator: its arenas (mapped), the bytes in use in "
        "them, and the free bytes inside them (an arena is returned only once all of it is free).",
        lambda r: _pymalloc_rows(r.memory.pymalloc),
    ),
    _Family(
        "gpuscope_hub_process_threads",
        "gauge",
        "Threads of the hub process, native ones included (each has a stack of its own).",
        lambda r: _one(r.memory.threads) if r.memory.threads is not None else None,
    ),
    _Family(
        "gpuscope_hub_structure_entries",
        "gauge",
        "Entries held by the hub's in-memory structures (observe stage, alert state, detectors), by name.",
        lambda r: r.structures,
    ),
)


def exposition(reading: Reading) -> str:
    """The text format of every family of :data:`FAMILIES` that ``reading`` has."""
    lines: list[str] = []
    for family in FAMILIES:
        rows = family.rows(reading)
        if rows is None:
            continue
        lines += [f"# HELP {family.name} {family.text}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in rows:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(
                f"{family.name}{{{inner}}} {_number(value)}" if inner else f"{family.name} {_number(value)}"
            )
    return "\n".join(lines) + "\n"


def render(
    hub: Hub,
    lag: IngestLag,
    uptime_s: float,
    storage_ok: bool,
    outbox_stats: Callable[[], dict[str, int]] | None = None,
    triage_stats: Callable[[], dict[str, float]] | None = None,
) -> str:
    """The exposition; reads the store's and the outbox's statistics (call it off the event loop)."""
    return exposition(read(hub, lag, uptime_s, storage_ok, outbox_stats, triage_stats))
