"""Playbooks of alerts that fire together share the store's answers: the fleet's snapshot is read
once (a whole-store snapshot per alert was most of a burst's triage CPU), each distinct event
query once, and every answer is what a playbook reading alone gets."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuscope.alert.checks import Reads
from gpuscope.alert.triage import run_playbook
from gpuscope.model import Alert, Batch, Event, Frame, Labels
from gpuscope.store.duckdb import DuckDBStore

T = 1_796_132_312.0


class CountedStore(DuckDBStore):
    """The real store, counting the reads playbooks make."""

    def __init__(self) -> None:
        super().__init__(":memory:", durable=False)
        self.snapshots = 0
        self.event_reads = 0

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        self.snapshots += 1
        return super().snapshot(metrics, max_age)

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        self.event_reads += 1
        return super().events(start, end, kind, labels, limit)


def unreachable(alert_id: str, node: str) -> Alert:
    return Alert(alert_id, "node_unreachable", "P1", "platform", {"node": node}, T, f"{node} silent", 20.0)


def test_a_burst_reads_the_snapshot_once_and_each_event_query_once_with_the_same_answers() -> None:
    store = CountedStore()
    try:
        for n in range(4):
            entities = [{"node": f"node-{n}", "gpu": str(g), "job": f"job-{n // 2}"} for g in range(2)]
            frame = Frame(T - 5, ["gpu_utilization_percent"], entities, np.full((2, 1), 90.0))
            store.append(Batch(f"node-{n}", frames=[frame], batch_id=f"b{n}"))
        store.append(
            Batch("node-1", events=[Event(T - 30, "xid", {"node": "node-1", "gpu": "1"}, {"code": 79})])
        )
        burst = [unreachable(f"al-{n}", f"node-{n}") for n in range(4)]
        alone = [run_playbook(a, Reads(store), T, burst)["diagnosis"] for a in burst]
        store.snapshots = store.event_reads = 0

        shared = Reads(store)
        together = [run_playbook(a, shared, T, burst)["diagnosis"] for a in burst]
        assert together == alone
        assert store.snapshots == 1
        assert store.event_reads == 3  # xid, gpu_lost, ecc_dbe: once for the four alerts
        texts = {step["check"]: step["result"] for step in together[1] if "check" in step}
        assert texts["workloads_on_node"] == "on node=node-1: job job-0"
        assert "xid 79 on node-1 GPU 1" in texts["faults_nearby"]
    finally:
        store.close()
