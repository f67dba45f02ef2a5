"""Playbook results read as text for people: dates rather than epoch seconds, short numbers."""

from __future__ import annotations

from gpuscope.alert.checks import Context, alert_details, faults_nearby
from gpuscope.model import Alert, Batch, Event
from gpuscope.store.duckdb import DuckDBStore

T = 1_796_132_312.285574


def test_root_cause_and_details_show_dates_and_short_numbers_not_raw_epochs() -> None:
    store = DuckDBStore(":memory:", durable=False)
    try:
        store.append(Batch("node-2", events=[Event(T, "xid", {"node": "node-2", "gpu": "3"}, {"code": 79})]))
        alert = Alert(
            "al-2",
            "node_unreachable",
            "P1",
            "platform",
            {"node": "node-2"},
            T + 5,
            "silent",
            2.5,
            details={"silence_seconds": 4.00013542175293, "first_ts": T, "last_report_ts": T + 1.5},
        )
        ctx = Context(alert, store, T + 10)
        root = faults_nearby(ctx).text
        assert "xid 79 on node-2 GPU 3 at 2026-" in root and "1796132312" not in root
        text = alert_details(ctx).text
        assert "silence_seconds=4" in text and "4.0001354" not in text
        assert "first_ts=2026-" in text and "1796132312" not in text
    finally:
        store.close()
