"""A cluster member's batches stored a tick at once (``PromStore.append_then``: one batch-id
lookup, one remote write and one PostgreSQL transaction for every batch started meanwhile) store
exactly what ``append`` stores batch by batch: the same samples in VictoriaMetrics, the same rows
in PostgreSQL, the same answers to the senders, retries and another hub's batches included."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg
import pytest

from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch, Frame
from gpuscope.sim.cluster import Simulator
from gpuscope.store.base import AppendResult
from gpuscope.store.errors import StoreError
from gpuscope.store.remote.local import LocalTSDB
from gpuscope.store.remote.meta import PostgresMeta
from gpuscope.store.remote.prom_store import PromStore
from pgserver import PostgresServer
from store_remote.tsdbs import start_tsdb

pytestmark = pytest.mark.integration

T0 = float(int(time.time()) - 120)
TICKS = 24  # training records start after the jobs warm up (tick 17)


def _ticks() -> list[list[Batch]]:
    """Agents' and SDKs' batches (frames, events, heartbeats, training records) of a small fleet
    with a fault, each with its id; a retry of an earlier batch in some ticks."""
    scenario = build_scenario(FleetShape(nodes=6, gpus_per_node=4, job_nodes=3), float(TICKS))
    out: list[list[Batch]] = []
    for k, tick in enumerate(Simulator(scenario, t0=T0).ticks()):
        batches = [*tick.node_batches.values(), *tick.sdk_batches]
        for i, batch in enumerate(batches):
            batch.batch_id = f"{batch.source}-{k}-{i}"
        if out and k % 3 == 0:
            batches.append(out[-1][0])  # a sender's retry of a batch stored a tick ago
        out.append(batches)
    # samples not reported (NaN) and series no TSDB takes (a metric name Prometheus refuses, a
    # reserved label), beside ones it takes, in one frame
    odd = Frame(
        T0 + TICKS,
        ["gpu_temp_celsius", "bad.metric", "gpu_power_watts"],
        [{"node": "odd-0", "gpu": "0"}, {"node": "odd-0", "gpu": "1"}, {"node": "odd-0", "__gpu": "2"}],
        np.array([[61.0, 1.0, np.nan], [np.nan, 2.0, 300.0], [62.0, np.nan, 301.0]]),
    )
    out.append([Batch("agent-odd-0", frames=[odd], batch_id="agent-odd-0-last")])
    return out


def _store(db: LocalTSDB, dsn: str) -> PromStore:
    return PromStore(db.write_url, db.url, PostgresMeta(dsn), retry_s=5)


def _stored_one_by_one(store: PromStore, ticks: list[list[Batch]]) -> list[AppendResult]:
    return [store.append(batch) for batches in ticks for batch in batches]


def _start_all(store: PromStore, batches: list[Batch]) -> list[AppendResult | Exception]:
    """Every batch started at once, the way the event loop starts them; what each was told."""
    told: dict[int, AppendResult | Exception] = {}
    done = threading.Semaphore(0)

    def durable(i: int, outcome: AppendResult | Exception) -> None:
        told[i] = outcome
        done.release()

    for i, batch in enumerate(batches):
        assert store.append_then(batch, lambda outcome, i=i: durable(i, outcome))
    for _ in batches:
        assert done.acquire(timeout=30)
    return [told[i] for i in range(len(batches))]


def _stored_a_tick_at_once(store: PromStore, ticks: list[list[Batch]]) -> list[AppendResult]:
    results: list[AppendResult] = []
    for batches in ticks:
        for outcome in _start_all(store, batches):
            assert isinstance(outcome, AppendResult), outcome
            results.append(outcome)
    return results


def _samples(db: LocalTSDB) -> list[tuple[str, list[Any], list[Any]]]:
    """Every series VictoriaMetrics holds, with its raw samples."""
    db.flush()
    text = httpx.get(f"{db.url}/api/v1/export", params={"match[]": '{__name__!=""}'}, timeout=30).text
    rows = [orjson.loads(line) for line in text.splitlines() if line]
    return sorted(
        (orjson.dumps(r["metric"], option=orjson.OPT_SORT_KEYS).decode(), r["timestamps"], r["values"])
        for r in rows
    )


def _rows(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as con:
        return {
            "events": con.execute(
                "SELECT ts, kind, labels, data FROM gpuscope_events ORDER BY ts, kind, labels, data"
            ).fetchall(),
            "training": con.execute(
                "SELECT ts, job, rank, step, labels, names, vals FROM gpuscope_training "
                "ORDER BY ts, job, rank, step"
            ).fetchall(),
            "batch_ids": con.execute("SELECT id FROM gpuscope_batch_ids ORDER BY id").fetchall(),
        }


def _answers(results: list[AppendResult]) -> list[tuple[Any, ...]]:
    return [
        (r.duplicate, r.samples, r.events, r.training, r.refused_samples, r.refused_entities, r.notes)
        for r in results
    ]


def test_a_tick_at_once_stores_what_batch_by_batch_stores(postgres_server: PostgresServer) -> None:
    ticks = _ticks()
    old_db, new_db = start_tsdb("victoriametrics"), start_tsdb("victoriametrics")
    old_dsn, new_dsn = postgres_server.create_database(), postgres_server.create_database()
    try:
        old, new = _store(old_db, old_dsn), _store(new_db, new_dsn)
        # another hub stored one batch already (a sender that failed over): a duplicate for both
        for dsn in (old_dsn, new_dsn):
            with _store(old_db if dsn == old_dsn else new_db, dsn) as other:
                other.append(ticks[2][1])
        before, after = _stored_one_by_one(old, ticks), _stored_a_tick_at_once(new, ticks)
        old.close()
        new.close()
        assert _answers(after) == _answers(before)
        assert sum(r.duplicate for r in after) >= 3  # the other hub's batch, the retries
        assert sum(r.events for r in after) > 0 and sum(r.training for r in after) > 0
        assert (after[-1].samples, after[-1].refused_samples) == (2, 4), after[-1]  # the odd frame
        stored = _samples(old_db)
        assert len(stored) > 100 and _samples(new_db) == stored
        assert _rows(new_dsn) == _rows(old_dsn)
    finally:
        old_db.stop()
        new_db.stop()


def test_a_tick_the_tsdb_cannot_take_is_not_acknowledged_and_its_ids_stay_free(
    postgres_server: PostgresServer,
) -> None:
    batches = [b for b in _ticks()[1] if b.frames]
    db = start_tsdb("victoriametrics")
    dsn = postgres_server.create_database()
    store = PromStore("http://127.0.0.1:9/api/v1/write", db.url, PostgresMeta(dsn), retry_s=0.2)
    try:
        assert all(isinstance(outcome, StoreError) for outcome in _start_all(store, batches))
        assert _rows(dsn)["batch_ids"] == []  # nothing of them is kept as stored
        store.close()
        with _store(db, dsn) as again:  # the senders' retries are stored, not taken for duplicates
            assert not any(again.append(b).duplicate for b in batches)
        assert len(_rows(dsn)["batch_ids"]) == len(batches)
    finally:
        db.stop()
