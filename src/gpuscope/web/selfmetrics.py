"""The hub's own ``/metrics`` in the Prometheus text format: what it ingested, refused, dropped,
how far behind its senders it is, what detection costs and how many notifications wait.

Counter names come from :class:`gpuscope.counters.Counters` (one home); this module only sorts
them into families: what was ingested, what was refused (bad input, auth, limits), and the rest.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuscope import __version__, procmem
from gpuscope.hub import Hub
from gpuscope.model import Batch

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INGESTED = {
    "ingest_batches": "batches",
    "ingest_samples": "samples",
    "ingest_events": "events",
    "ingest_training_records": "training_records",
}
_REFUSAL_WORDS = ("refused", "rejected", "rate_limited", "too_large")


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


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str, rows: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, value in rows:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            self.lines.append(f"{name}{{{inner}}} {_number(value)}" if inner else f"{name} {_number(value)}")


def render(
    hub: Hub,
    lag: IngestLag,
    uptime_s: float,
    storage_ok: bool,
    outbox_stats: Callable[[], dict[str, int]] | None = None,
) -> str:
    """The exposition; reads the store's and the outbox's statistics (call it off the event loop)."""
    counters = hub.counters.snapshot()
    refused = {k: v for k, v in counters.items() if k not in INGESTED and any(w in k for w in _REFUSAL_WORDS)}
    other = {k: v for k, v in counters.items() if k not in INGESTED and k not in refused}
    out = _Text()
    out.family("gpuscope_hub_build_info", "gauge", "Version of the hub.", [({"version": __version__}, 1)])
    out.family(
        "gpuscope_hub_uptime_seconds", "gauge", "Seconds since the hub's API started.", [({}, uptime_s)]
    )
    out.family(
        "gpuscope_hub_storage_up",
        "gauge",
        "1 while batches are stored, 0 while the store fails.",
        [({}, storage_ok)],
    )
    out.family(
        "gpuscope_hub_ingested_total",
        "counter",
        "What the hub stored: batches, samples, events and training records.",
        [({"kind": kind}, counters.get(name, 0)) for name, kind in INGESTED.items()],
    )
    out.family(
        "gpuscope_hub_refused_total",
        "counter",
        "Requests, batches or values refused, by reason (bad input, auth, limits); api_refused_N counts "
        "the HTTP answers, so it overlaps the other reasons.",
        [({"reason": k}, v) for k, v in sorted(refused.items())],
    )
    out.family(
        "gpuscope_hub_operations_total",
        "counter",
        "Every other counted event of the hub (drops, retries, notifications, warm-up), by name.",
        [({"name": k}, v) for k, v in sorted(other.items())],
    )
    out.family(
        "gpuscope_hub_detection_withheld_total",
        "counter",
        "What the detectors refused as malformed or withheld, by reason.",
        [({"reason": k}, v) for k, v in sorted(hub.detection_stats().items())],
    )
    out.family(
        "gpuscope_hub_detection_seconds_total",
        "counter",
        "Wall time spent in the detectors (the cost of detection).",
        [({}, hub.detect_seconds)],
    )
    out.family(
        "gpuscope_hub_ingest_lag_seconds",
        "gauge",
        "Age of the newest timestamp of the last stored batch when the hub's detectors saw it "
        "(stored, then observed a tick at once; NaN before any).",
        [({}, math.nan if lag.last is None else lag.last)],
    )
    out.family(
        "gpuscope_hub_ingest_lag_max_seconds",
        "gauge",
        "Largest ingest lag seen since start.",
        [({}, lag.max)],
    )
    out.family("gpuscope_hub_firing_alerts", "gauge", "Alerts firing now.", [({}, len(hub.firing()))])
    if outbox_stats is not None:
        box = outbox_stats()
        out.family(
            "gpuscope_hub_outbox_notifications",
            "gauge",
            "Notifications in the outbox by state: pending (waiting or retried), delivered, dead.",
            [({"state": state}, box[state]) for state in ("pending", "delivered", "dead")],
        )
    store: dict[str, Any] = hub.store.stats()
    rows = store.get("rows")
    if isinstance(rows, dict):
        out.family(
            "gpuscope_hub_store_rows",
            "gauge",
            "Rows per table of the store.",
            [({"table": str(k)}, float(v)) for k, v in sorted(rows.items())],
        )
    memory = store.get("memory")
    if isinstance(memory, dict):
        out.family(
            "gpuscope_hub_store_memory_bytes",
            "gauge",
            "The embedded store's own memory accounting (DuckDB's duckdb_memory()), by tag.",
            [({"tag": str(k)}, float(v)) for k, v in sorted(memory.items())],
        )
    for key in ("disk_bytes", "entities", "metrics", "batch_ids_remembered"):
        value = store.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.family(
                f"gpuscope_hub_store_{key}", "gauge", f"The store's {key.replace('_', ' ')}.", [({}, value)]
            )
    _process(out, hub)
    return "\n".join(out.lines) + "\n"


def _process(out: _Text, hub: Hub) -> None:
    """Where the process's memory is: what grows over a soak (issue 13 (d)) shows up here."""
    mem = procmem.snapshot()
    out.family(
        "gpuscope_hub_process_resident_bytes",
        "gauge",
        "Resident set of the hub process.",
        [({}, mem.rss_bytes)],
    )
    out.family(
        "gpuscope_hub_process_python_blocks",
        "gauge",
        "Memory blocks the Python interpreter has allocated and not freed.",
        [({}, mem.python_blocks)],
    )
    out.family(
        "gpuscope_hub_process_gc_objects",
        "gauge",
        "Objects waiting for the garbage collector, by generation.",
        [({"generation": str(g)}, n) for g, n in enumerate(mem.gc_tracked)],
    )
    malloc = {"in_use": mem.malloc_in_use_bytes, "free": mem.malloc_free_bytes, "mmap": mem.malloc_mmap_bytes}
    out.family(
        "gpuscope_hub_process_malloc_bytes",
        "gauge",
        "glibc malloc: bytes in use, free but kept inside the arenas, and mapped on their own.",
        [({"state": k}, v) for k, v in malloc.items() if v is not None],
    )
    out.family(
        "gpuscope_hub_structure_entries",
        "gauge",
        "Entries held by the hub's in-memory structures (observe stage, alert state, detectors), by name.",
        procmem.structure_rows(hub.structures()),
    )
