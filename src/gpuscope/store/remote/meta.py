"""The meta store of a remote backend: events, training records, alerts and batch-id de-duplication.

A TSDB keeps numbers per series; these records are documents. They go to a local
:class:`~gpuscope.store.duckdb.DuckDBStore` (its events, training, alerts and batch-id tables;
the telemetry tables stay empty), or to PostgreSQL so several hubs share them (:class:`PostgresMeta`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import orjson
import psycopg

from gpuscope.model import Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store.alert_docs import alert_doc, latest
from gpuscope.store.base import AppendResult, GpuTime, RecordStore
from gpuscope.store.errors import StoreError
from gpuscope.store.event_filter import event_filter
from gpuscope.store.group import GroupCommitter
from gpuscope.store.prepare import Prepared, Preparer
from gpuscope.store.registry import ColumnRegistry, EntityRegistry
from gpuscope.store.remote.heartbeats import HEARTBEAT, HeartbeatMemory

DAY = 86_400.0
#: how long a group's writer waits for the rest of a wave of concurrent requests (see group.py)
GROUP_LINGER_S = 0.005
#: batch ids looked up, or batches written, in one PostgreSQL round trip or transaction at most
GROUP_ITEMS = 512


class MetaStore(RecordStore, Protocol):
    """The non-telemetry half of :class:`gpuscope.store.base.Store`, plus a batch-id lookup."""

    path: str

    def has_batch(self, batch_id: str) -> bool: ...

    def stored_ids(self, batch_ids: list[str]) -> set[str]:
        """Which of these batch ids are stored (one round trip)."""
        ...

    def append(self, batch: Batch) -> AppendResult:
        """Store the batch's events and training records and its id, in one transaction; a
        duplicate id stores nothing and says so."""
        ...

    def append_many(self, batches: list[Batch]) -> list[AppendResult]:
        """:meth:`append` of several batches at once (one transaction where the store can)."""
        ...


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS gpuscope_events (
        seq BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
        labels TEXT NOT NULL, data TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS gpuscope_events_ts ON gpuscope_events (ts)",
    """CREATE TABLE IF NOT EXISTS gpuscope_training (
        seq BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, job TEXT NOT NULL,
        rank INTEGER NOT NULL, step BIGINT NOT NULL, labels TEXT NOT NULL, names TEXT[] NOT NULL,
        vals DOUBLE PRECISION[] NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS gpuscope_training_job_ts ON gpuscope_training (job, ts)",
    """CREATE TABLE IF NOT EXISTS gpuscope_alerts (
        id TEXT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL, resolved_at DOUBLE PRECISION,
        doc TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS gpuscope_batch_ids (
        id TEXT PRIMARY KEY, received DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS gpuscope_gpu_time (
        res INTEGER NOT NULL, bucket DOUBLE PRECISION NOT NULL, node TEXT NOT NULL, gpu TEXT NOT NULL,
        job TEXT NOT NULL, team TEXT NOT NULL, service TEXT NOT NULL, cause TEXT NOT NULL,
        seconds DOUBLE PRECISION NOT NULL, lost DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (res, bucket, node, gpu, job, team, service, cause))""",
)
SCHEMA_LOCK = zlib.crc32(b"gpuscope meta schema")  # hubs starting together create the tables once
FOLD_LOCK = zlib.crc32(b"gpuscope gpu time fold")  # hubs folding together move each minute once
_GPU_TIME_COLUMNS = "res, bucket, node, gpu, job, team, service, cause, seconds, lost"


def _label_fragment(key: str, value: str) -> str:
    """The exact text ``"key":"value"`` has in compact, key-sorted JSON. Labels are flat strings,
    so this text can only occur as that pair: quotes inside values are escaped."""
    return orjson.dumps({key: value}).decode()[1:-1]


class PostgresMeta:
    """:class:`MetaStore` in PostgreSQL (psycopg 3), shared by every hub that names the same DSN.

    Labels, event data and alert documents are kept as JSON text, exactly as stored (PostgreSQL's
    ``jsonb`` refuses ``\\u0000`` and would reorder keys); training values as a ``float8[]`` so a
    NaN loss survives.

    The batch-id lookups and the appends of concurrent requests are grouped (``group_writes``):
    one query looks up every id asked meanwhile, one transaction stores every batch appended
    meanwhile, instead of a round trip or a transaction per request. Heartbeats stay in memory and
    only their transitions are stored (:mod:`.heartbeats`): a batch of heartbeats alone writes
    nothing, not even its id (a heartbeat seen twice by the detectors is harmless).
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_metrics: int = 512,
        pool_size: int = 8,
        record_retention_s: float = 90 * DAY,
        batch_id_ttl_s: float = DAY,
        group_writes: bool = True,
    ) -> None:
        self.dsn = dsn
        self.heartbeats = HeartbeatMemory()
        self.path = "postgres"
        self.record_retention_s = record_retention_s
        self.batch_id_ttl_s = batch_id_ttl_s
        self._preparer = Preparer(EntityRegistry(1), ColumnRegistry(1), ColumnRegistry(max_metrics))
        self._pool: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)
        self._closed = False
        with self._conn() as con, con.transaction():
            con.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEMA_LOCK])
            for stmt in SCHEMA:
                con.execute(stmt)
        self._lookups: GroupCommitter[str, bool] | None = None
        self._appends: GroupCommitter[tuple[str | None, Prepared], AppendResult] | None = None
        if group_writes:
            self._lookups = GroupCommitter(
                self._have, lambda _: 1, GROUP_ITEMS, "gpuscope-meta-lookups", GROUP_LINGER_S
            )
            self._appends = GroupCommitter(
                self._append_group, lambda _: 1, GROUP_ITEMS, "gpuscope-meta-writer", GROUP_LINGER_S
            )

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed:
            raise StoreError("the store is closed")
        with self._slots:
            try:
                con = self._pool.get_nowait()
            except queue.Empty:
                try:
                    con = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
                except psycopg.Error as exc:
                    raise StoreError(f"meta store (PostgreSQL) unreachable: {exc}") from None
            try:
                yield con
            except psycopg.Error as exc:
                con.close()  # broken or mid-transaction: never hand it out again
                raise StoreError(f"meta store (PostgreSQL) failed: {exc}") from None
            except BaseException:
                con.close()
                raise
            if con.closed:
                return
            self._pool.put(con)

    def has_batch(self, batch_id: str) -> bool:
        if self._lookups is not None:
            return self._lookups.submit(batch_id).result()
        return self._have([batch_id])[0]

    def _have(self, batch_ids: list[str]) -> list[bool]:
        """Which of these batch ids are stored, in one query."""
        with self._conn() as con:
            rows = con.execute(
                "SELECT id FROM gpuscope_batch_ids WHERE id = ANY(%s)", [list(set(batch_ids))]
            ).fetchall()
        found = {str(r[0]) for r in rows}
        return [bid in found for bid in batch_ids]

    def stored_ids(self, batch_ids: list[str]) -> set[str]:
        found: set[str] = set()
        for at in range(0, len(batch_ids), GROUP_ITEMS):
            chunk = batch_ids[at : at + GROUP_ITEMS]
            found.update(bid for bid, seen in zip(chunk, self._have(chunk), strict=True) if seen)
        return found

    def append(self, batch: Batch) -> AppendResult:
        # validated here, in the caller's thread: a bad batch is refused before it joins a group
        told, prepared = self._prepare(batch)
        if prepared is None:
            return told
        if self._appends is not None:
            return self._appends.submit((batch.batch_id, prepared)).result()
        return self._append_group([(batch.batch_id, prepared)])[0]

    def append_many(self, batches: list[Batch]) -> list[AppendResult]:
        """Every batch in one transaction (up to GROUP_ITEMS a transaction), from the caller's
        thread: a remote store's tick, already grouped."""
        prepared = [self._prepare(batch) for batch in batches]
        pairs = zip(batches, prepared, strict=True)
        items = [(batch.batch_id, p) for batch, (_, p) in pairs if p is not None]
        written: list[AppendResult] = []
        for at in range(0, len(items), GROUP_ITEMS):
            written += self._append_group(items[at : at + GROUP_ITEMS])
        stored = iter(written)
        return [told if p is None else next(stored) for told, p in prepared]

    def _prepare(self, batch: Batch) -> tuple[AppendResult, Prepared | None]:
        """What the sender is told of ``batch``'s events and training records, and what of them is
        stored (its steady heartbeats stay in memory), validated; None when nothing is
        (heartbeats alone: not even the id)."""
        prepared = self._preparer.prepare(Batch(batch.source, events=batch.events, training=batch.training))
        if any(e.kind == HEARTBEAT for e in batch.events):
            kept = self.heartbeats.sift(batch.events)
            if not kept and not batch.training:
                return prepared.result, None
            stored = self._preparer.prepare(Batch(batch.source, events=kept, training=batch.training))
            stored.result = prepared.result  # the sender is told what it sent was accepted
            prepared = stored
        return prepared.result, prepared

    def _append_group(self, items: list[tuple[str | None, Prepared]]) -> list[AppendResult]:
        """Store several batches in one transaction: their new ids, then their events and training
        records; a batch whose id is stored already (or twice in the group) stores nothing."""
        names = self._preparer.train_columns.name
        ids = list(dict.fromkeys(bid for bid, _ in items if bid is not None))
        results: list[AppendResult] = []
        events: list[tuple[float, str, str, str]] = []
        training: list[tuple[Any, ...]] = []
        with self._conn() as con, con.transaction():
            new: set[str] = set()
            if ids:
                rows = con.execute(
                    "INSERT INTO gpuscope_batch_ids (id, received) SELECT unnest(%s::text[]), %s "
                    "ON CONFLICT DO NOTHING RETURNING id",
                    [ids, time.time()],
                ).fetchall()
                new = {str(r[0]) for r in rows}
            for bid, prepared in items:
                if bid is not None:
                    if bid not in new:
                        results.append(AppendResult(duplicate=True))
                        continue
                    new.discard(bid)
                events += prepared.events
                training += [
                    (t.ts, t.job, t.rank, t.step, t.labels, [names(c) for c in t.cols], t.values)
                    for t in prepared.training
                ]
                results.append(prepared.result)
            with con.cursor() as cur:
                if events:
                    cur.executemany(
                        "INSERT INTO gpuscope_events (ts, kind, labels, data) VALUES (%s, %s, %s, %s)", events
                    )
                if training:
                    cur.executemany(
                        "INSERT INTO gpuscope_training (ts, job, rank, step, labels, names, vals) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        training,
                    )
        return results

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        where, params = event_filter(
            start, end, kind, labels, lambda k, v: ("strpos(labels, %s) > 0", _label_fragment(k, v)), "%s"
        )
        with self._conn() as con:
            rows = con.execute(
                f"SELECT ts, kind, labels, data FROM gpuscope_events WHERE {where} "
                "ORDER BY ts DESC, seq DESC LIMIT %s",
                [*params, int(limit)],
            ).fetchall()
        return [Event(float(t), str(k), orjson.loads(lb), orjson.loads(d)) for t, k, lb, d in rows[::-1]]

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]:
        where = "job = %s AND ts >= %s AND ts <= %s" + (" AND rank = %s" if rank is not None else "")
        params: list[Any] = [job, start, end, *([rank] if rank is not None else []), int(limit)]
        with self._conn() as con:
            rows = con.execute(
                "SELECT ts, job, rank, step, labels, names, vals FROM gpuscope_training "
                f"WHERE {where} ORDER BY ts DESC, rank DESC, seq DESC LIMIT %s",
                params,
            ).fetchall()
        return [
            TrainingRecord(
                float(r[0]),
                str(r[1]),
                int(r[2]),
                int(r[3]),
                {n: float(v) for n, v in zip(r[5], r[6], strict=True) if v is not None},
                orjson.loads(r[4]),
            )
            for r in rows[::-1]
        ]

    def save_alert(self, alert: Alert) -> None:
        self.save_alerts([alert])

    def save_alerts(self, alerts: Sequence[Alert]) -> None:
        rows = [(a.id, a.started_at, a.resolved_at, alert_doc(a)) for a in latest(alerts)]
        if not rows:
            return
        # one transaction, its statements pipelined by psycopg into one round trip
        with self._conn() as con, con.transaction(), con.cursor() as cur:
            cur.executemany(
                "INSERT INTO gpuscope_alerts VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "started_at = EXCLUDED.started_at, resolved_at = EXCLUDED.resolved_at, doc = EXCLUDED.doc",
                rows,
            )

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        where = "WHERE resolved_at IS NULL" if firing_only else ""
        with self._conn() as con:
            rows = con.execute(
                f"SELECT doc FROM gpuscope_alerts {where} ORDER BY started_at DESC, id LIMIT %s", [int(limit)]
            ).fetchall()
        return [Alert(**orjson.loads(r[0])) for r in rows]

    def save_gpu_time(self, cells: list[GpuTime]) -> None:
        if not cells:
            return
        with self._conn() as con, con.transaction(), con.cursor() as cur:
            cur.executemany(
                f"INSERT INTO gpuscope_gpu_time ({_GPU_TIME_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (res, bucket, node, gpu, job, team, service, cause) DO UPDATE SET "
                "seconds = EXCLUDED.seconds, lost = EXCLUDED.lost",
                [
                    (c.res, c.bucket, c.node, c.gpu, c.job, c.team, c.service, c.cause, c.seconds, c.lost)
                    for c in cells
                ],
            )

    def fold_gpu_time(self, before: float) -> int:
        with self._conn() as con, con.transaction():
            con.execute("SELECT pg_advisory_xact_lock(%s)", [FOLD_LOCK])
            con.execute(
                f"INSERT INTO gpuscope_gpu_time ({_GPU_TIME_COLUMNS}) "
                "SELECT 3600, floor(bucket / 3600) * 3600 AS hour, node, '', job, team, service, cause, "
                "sum(seconds), sum(lost) FROM gpuscope_gpu_time WHERE res = 60 AND bucket + 60 <= %s "
                "GROUP BY hour, node, job, team, service, cause "
                "ON CONFLICT (res, bucket, node, gpu, job, team, service, cause) DO UPDATE SET "
                "seconds = gpuscope_gpu_time.seconds + EXCLUDED.seconds, "
                "lost = gpuscope_gpu_time.lost + EXCLUDED.lost",
                [before],
            )
            return con.execute(
                "DELETE FROM gpuscope_gpu_time WHERE res = 60 AND bucket + 60 <= %s", [before]
            ).rowcount

    def gpu_time(self, start: float, end: float) -> list[GpuTime]:
        with self._conn() as con:
            rows = con.execute(
                f"SELECT {_GPU_TIME_COLUMNS} FROM gpuscope_gpu_time WHERE bucket < %s AND bucket + res > %s "
                "ORDER BY res, bucket",
                [end, start],
            ).fetchall()
        return [
            GpuTime(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], float(r[8]), float(r[9]))
            for r in rows
        ]

    def compact(self, now: float) -> dict[str, int]:
        """Drop events and training records past their keep time (``now`` in the data's clock)
        and batch ids past theirs (wall clock: retries happen in real time)."""
        keep = now - self.record_retention_s
        out: dict[str, int] = {}
        with self._conn() as con:
            for table, sql, arg in (
                ("events", "DELETE FROM gpuscope_events WHERE ts < %s", keep),
                ("training", "DELETE FROM gpuscope_training WHERE ts < %s", keep),
                ("gpu_time", "DELETE FROM gpuscope_gpu_time WHERE bucket < %s", keep),
                (
                    "batch_ids",
                    "DELETE FROM gpuscope_batch_ids WHERE received < %s",
                    time.time() - self.batch_id_ttl_s,
                ),
            ):
                out[table] = con.execute(sql, [arg]).rowcount
        return out

    def stats(self) -> dict[str, Any]:
        with self._conn() as con:
            counts = {
                t: int(con.execute(f"SELECT count(*) FROM gpuscope_{t}").fetchone()[0])  # type: ignore[index]
                for t in ("events", "training", "alerts", "batch_ids")
            }
        memory = {"ranks": len(self.heartbeats), "kept_in_memory": self.heartbeats.kept}
        return {"backend": "postgres", "rows": counts, "heartbeats": memory}

    def close(self) -> None:
        if self._closed:
            return
        for writer in (self._lookups, self._appends):
            if writer is not None:
                writer.close()  # what is queued is still written
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return
