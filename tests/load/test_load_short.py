"""The load benchmark in short (``bench/bench_load.py`` runs the 1,024-node version): a real hub
process under 32 simulated agents and their training SDKs for 10 s, with an XID injected midway."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.loadgen import FleetShape, LoadOptions, run_load
from support import free_port

pytestmark = pytest.mark.integration


def test_every_batch_is_acknowledged_and_stored_once_and_the_fault_is_detected(
    hub_factory: type, tmp_path: Path
) -> None:
    hub = hub_factory(free_port(), tmp_path / "load.duckdb")
    hub.wait_ready()
    shape = FleetShape(nodes=32, gpus_per_node=8)
    report = run_load(
        LoadOptions(
            hubs=[hub.url],
            shape=shape,
            duration=10,
            workers=1,
            hub_pids=[hub.proc.pid],
            start_delay=1.0,
            grace=30.0,
            # the simulator's own first ticks: its services close no quality window in 10 s, so
            # the hub derives no rows of its own and what it stores is exactly what was sent
            warmup=0,
        )
    )
    st = report.stats
    # every agent and SDK batch acknowledged, none refused, none left behind
    assert report.drops == 0, report.to_dict()["batches"]
    assert st.batches_acked == st.batches_offered >= 10 * shape.nodes
    # every value offered is stored or refused by the hub with a reason (counted, never silent)
    assert st.samples_acked + st.samples_refused == st.samples_offered, st.refusal_messages
    assert st.samples_acked > 10 * shape.nodes * shape.gpus_per_node * 40
    assert st.samples_refused <= st.samples_offered // 10_000, st.refusal_messages
    assert st.events_acked > 5 * 31 * 8  # the SDKs' rank heartbeats (jobs still start up: no steps yet)
    # stored exactly once: the hub holds as many rows, events and training records as were acknowledged
    assert report.stored() == {
        "rows": st.rows_acked,
        "events": st.events_acked,
        "training": st.training_acked,
    }
    counters = report.health[0]["counters"]
    assert counters["ingest_batches"] + counters.get("ingest_duplicate_batches", 0) == st.batches_acked
    assert counters["ingest_samples"] == st.samples_acked
    # the XID 79 injected at 4 s raised gpu_xid_fatal on its GPU, within the hard-fault budget
    (xid,) = report.detections
    assert xid.expected.rule == "gpu_xid_fatal"
    assert xid.ttd is not None and xid.ttd <= 15, report.rows()
    assert not report.unexplained_alerts()
    # the hub was measured
    assert report.hub_rss_peak > 0 and st.latencies
