"""The hub's /metrics text (gpuscope.web.selfmetrics): one table of families, written the same way
for each; the text on a fixed reading is pinned to the byte, and prometheus_client's parser reads
what a real hub renders."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from gpuscope import __version__
from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.procmem import ProcessMemory
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.selfmetrics import FAMILIES, IngestLag, Reading, exposition, render

READING = Reading(
    uptime_s=12.5,
    storage_ok=False,
    counters={
        "ingest_batches": 3,
        "ingest_samples": 24,
        "auth_refused_401": 1,
        "ingest_rejected_batches": 2,
        "observe_ticks": 4,
        "api_refused_429": 1,
    },
    withheld={"nan_values": 2, "rank_verdicts_found_on_wire": 3},
    detect_seconds=0.125,
    lag_last=None,
    lag_max=10.0,
    firing=1,
    outbox={"pending": 2, "delivered": 5, "dead": 0},
    store={"rows": {"samples": 12, 'odd "table"\\': 1}, "disk_bytes": 4096, "entities": 4, "metrics": True},
    memory=ProcessMemory(
        rss_bytes=100 * 2**20,
        python_blocks=150_000,
        gc_tracked=(577, 2, 8),
        malloc_in_use_bytes=14_000_000,
        malloc_free_bytes=None,
        malloc_mmap_bytes=819_200,
    ),
    structures=[({"structure": "alert_state"}, 0.0), ({"structure": "observe_stage"}, 4.0)],
)

EXPECTED = f"""# HELP gpuscope_hub_build_info Version of the hub.
# TYPE gpuscope_hub_build_info gauge
gpuscope_hub_build_info{{version="{__version__}"}} 1.0
# HELP gpuscope_hub_uptime_seconds Seconds since the hub's API started.
# TYPE gpuscope_hub_uptime_seconds gauge
gpuscope_hub_uptime_seconds 12.5
# HELP gpuscope_hub_storage_up 1 while batches are stored, 0 while the store fails.
# TYPE gpuscope_hub_storage_up gauge
gpuscope_hub_storage_up 0.0
# HELP gpuscope_hub_ingested_total What the hub stored: batches, samples, events and training records.
# TYPE gpuscope_hub_ingested_total counter
gpuscope_hub_ingested_total{{kind="batches"}} 3.0
gpuscope_hub_ingested_total{{kind="samples"}} 24.0
gpuscope_hub_ingested_total{{kind="events"}} 0.0
gpuscope_hub_ingested_total{{kind="training_records"}} 0.0
# HELP gpuscope_hub_refused_total Requests, batches or values refused, by reason (bad input, auth, limits); \
api_refused_N counts the HTTP answers, so it overlaps the other reasons.
# TYPE gpuscope_hub_refused_total counter
gpuscope_hub_refused_total{{reason="api_refused_429"}} 1.0
gpuscope_hub_refused_total{{reason="auth_refused_401"}} 1.0
gpuscope_hub_refused_total{{reason="ingest_rejected_batches"}} 2.0
# HELP gpuscope_hub_operations_total Every other counted event of the hub (drops, retries, notifications, \
warm-up), by name.
# TYPE gpuscope_hub_operations_total counter
gpuscope_hub_operations_total{{name="observe_ticks"}} 4.0
# HELP gpuscope_hub_detection_withheld_total What the detectors refused as malformed or withheld, by reason.
# TYPE gpuscope_hub_detection_withheld_total counter
gpuscope_hub_detection_withheld_total{{reason="nan_values"}} 2.0
# HELP gpuscope_hub_silence_verdicts_found_on_wire_total Silence verdicts given although a hub gap or late \
data would have withheld them, because the sender had stopped sending requests too (X-Gpuscope-Sender): \
found dead on the wire, by rule.
# TYPE gpuscope_hub_silence_verdicts_found_on_wire_total counter
gpuscope_hub_silence_verdicts_found_on_wire_total{{rule="node_unreachable"}} 0.0
gpuscope_hub_silence_verdicts_found_on_wire_total{{rule="rank_lost"}} 3.0
# HELP gpuscope_hub_detection_seconds_total Wall time spent in the detectors (the cost of detection).
# TYPE gpuscope_hub_detection_seconds_total counter
gpuscope_hub_detection_seconds_total 0.125
# HELP gpuscope_hub_ingest_lag_seconds Age of the newest timestamp of the last stored batch when the hub's \
detectors saw it (stored, then observed a tick at once; NaN before any).
# TYPE gpuscope_hub_ingest_lag_seconds gauge
gpuscope_hub_ingest_lag_seconds NaN
# HELP gpuscope_hub_ingest_lag_max_seconds Largest ingest lag seen since start.
# TYPE gpuscope_hub_ingest_lag_max_seconds gauge
gpuscope_hub_ingest_lag_max_seconds 10.0
# HELP gpuscope_hub_firing_alerts Alerts firing now.
# TYPE gpuscope_hub_firing_alerts gauge
gpuscope_hub_firing_alerts 1.0
# HELP gpuscope_hub_outbox_notifications Notifications in the outbox by state: pending (waiting or retried), \
delivered, dead.
# TYPE gpuscope_hub_outbox_notifications gauge
gpuscope_hub_outbox_notifications{{state="pending"}} 2.0
gpuscope_hub_outbox_notifications{{state="delivered"}} 5.0
gpuscope_hub_outbox_notifications{{state="dead"}} 0.0
# HELP gpuscope_hub_store_rows Rows per table of the store.
# TYPE gpuscope_hub_store_rows gauge
gpuscope_hub_store_rows{{table="odd \\"table\\"\\\\"}} 1.0
gpuscope_hub_store_rows{{table="samples"}} 12.0
# HELP gpuscope_hub_store_disk_bytes The store's disk bytes.
# TYPE gpuscope_hub_store_disk_bytes gauge
gpuscope_hub_store_disk_bytes 4096.0
# HELP gpuscope_hub_store_entities The store's entities.
# TYPE gpuscope_hub_store_entities gauge
gpuscope_hub_store_entities 4.0
# HELP gpuscope_hub_process_resident_bytes Resident set of the hub process.
# TYPE gpuscope_hub_process_resident_bytes gauge
gpuscope_hub_process_resident_bytes 104857600.0
# HELP gpuscope_hub_process_python_blocks Memory blocks the Python interpreter has allocated and not freed.
# TYPE gpuscope_hub_process_python_blocks gauge
gpuscope_hub_process_python_blocks 150000.0
# HELP gpuscope_hub_process_gc_objects Objects waiting for the garbage collector, by generation.
# TYPE gpuscope_hub_process_gc_objects gauge
gpuscope_hub_process_gc_objects{{generation="0"}} 577.0
gpuscope_hub_process_gc_objects{{generation="1"}} 2.0
gpuscope_hub_process_gc_objects{{generation="2"}} 8.0
# HELP gpuscope_hub_process_malloc_bytes glibc malloc: bytes in use, free but kept inside the arenas, and \
mapped on their own.
# TYPE gpuscope_hub_process_malloc_bytes gauge
gpuscope_hub_process_malloc_bytes{{state="in_use"}} 14000000.0
gpuscope_hub_process_malloc_bytes{{state="mmap"}} 819200.0
# HELP gpuscope_hub_structure_entries Entries held by the hub's in-memory structures (observe stage, alert \
state, detectors), by name.
# TYPE gpuscope_hub_structure_entries gauge
gpuscope_hub_structure_entries{{structure="alert_state"}} 0.0
gpuscope_hub_structure_entries{{structure="observe_stage"}} 4.0
"""


def test_the_text_of_a_fixed_reading_is_the_same_to_the_byte() -> None:
    """Families with no rows keep their HELP and TYPE; families the reading lacks (store memory, a
    store figure that is no number) are left out; label values are escaped; no lag yet is NaN; the
    verdicts found on the wire are counted in a family of their own, not among the withheld."""
    assert exposition(READING) == EXPECTED


def test_a_hub_with_no_outbox_has_no_outbox_family() -> None:
    outbox = [line for line in EXPECTED.splitlines(keepends=True) if "gpuscope_hub_outbox_" in line]
    assert len(outbox) == 5
    assert exposition(replace(READING, outbox=None)) == "".join(
        line for line in EXPECTED.splitlines(keepends=True) if line not in outbox
    )


def test_what_a_real_hub_renders_parses_with_prometheus_client_and_has_every_family() -> None:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    lag = IngestLag(clock=lambda: 1000.0)
    hub.add_observer(lag.observe)
    labels = [{"node": "n1", "gpu": str(g)} for g in range(4)]
    for i in range(3):
        frame = Frame(
            990.0 + i, ["gpu_utilization_percent", "gpu_temp_celsius"], labels, np.full((4, 2), 50.0)
        )
        hub.ingest(Batch(source="n1", frames=[frame], batch_id=f"b{i}"))
    hub.settle()
    hub.counters.inc("ingest_rejected_batches")
    text = render(
        hub,
        lag,
        7.0,
        True,
        lambda: {"pending": 0, "delivered": 3, "dead": 1},
        lambda: {"depth": 2.0, "oldest_wait_seconds": 1.5},
    )
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # the parser names a counter family without its _total suffix
    assert {f.name.removesuffix("_total") for f in FAMILIES} == set(families)
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("gpuscope_hub_ingested_total", (("kind", "samples"),))] == 24.0
    assert value[("gpuscope_hub_refused_total", (("reason", "ingest_rejected_batches"),))] == 1.0
    assert value[("gpuscope_hub_ingest_lag_seconds", ())] == 8.0
    assert value[("gpuscope_hub_ingest_lag_max_seconds", ())] == 10.0
    assert value[("gpuscope_hub_outbox_notifications", (("state", "dead"),))] == 1.0
    assert value[("gpuscope_hub_triage_queue_depth", ())] == 2.0
    assert value[("gpuscope_hub_triage_oldest_wait_seconds", ())] == 1.5
    assert value[("gpuscope_hub_store_batch_ids_remembered", ())] == 3.0
    assert value[("gpuscope_hub_process_resident_bytes", ())] > 10 * 2**20
    assert math.isfinite(value[("gpuscope_hub_detection_seconds_total", ())])
