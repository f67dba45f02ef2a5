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
from collections.abc import Iterator
from typing import Any, Protocol

import orjson
import psycopg

from gpuscope.model import Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store.base import AppendResult, GpuTime, RecordStore
from gpuscope.store.errors import StoreError
from gpuscope.store.event_filter import event_filter
from gpuscope.store.prepare import Preparer
from gpuscope.store.registry import ColumnRegistry, EntityRegistry

DAY = 86_400.0


class MetaStore(RecordStore, Protocol):
    """The non-telemetry half of :class:`gpuscope.store.base.Store`, plus a batch-id lookup."""

    path: str

    def has_batch(self, batch_id: str) -> bool: ...

    def append(self, batch: Batch) -> AppendResult:
        """Store the batch's events and training records and its id, in one transaction; a
        duplicate id stores nothing and says so."""
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
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_metrics: int = 512,
        pool_size: int = 8,
        record_retention_s: float = 90 * DAY,
        batch_id_ttl_s: float = DAY,
    ) -> None:
        self.dsn = dsn
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
        with self._conn() as con:
            row = con.execute("SELECT 1 FROM gpuscope_batch_ids WHERE id = %s", [batch_id]).fetchone()
        return row is not None

    def append(self, batch: Batch) -> AppendResult:
        prepared = self._preparer.prepare(Batch(batch.source, events=batch.events, training=batch.training))
        result = prepared.result
        names = self._preparer.train_columns.name
        with self._conn() as con, con.transaction():
            if batch.batch_id is not None:
                new = con.execute(
                    "INSERT INTO gpuscope_batch_ids VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING id",
                    [batch.batch_id, time.time()],
                ).fetchone()
                if new is None:
                    return AppendResult(duplicate=True)
            with con.cursor() as cur:
                if prepared.events:
                    cur.executemany(
                        "INSERT INTO gpuscope_events (ts, kind, labels, data) VALUES (%s, %s, %s, %s)",
                        prepared.events,
                    )
                if prepared.training:
                    cur.executemany(
                        "INSERT INTO gpuscope_training (ts, job, rank, step, labels, names, vals) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        [
                            (t.ts, t.job, t.rank, t.step, t.labels, [names(c) for c in t.cols], t.values)
                            for t in prepared.training
                        ],
                    )
        return result

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
        doc = orjson.dumps(
            alert.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str
        ).decode()
        with self._conn() as con:
            con.execute(
                "INSERT INTO gpuscope_alerts VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "started_at = EXCLUDED.started_at, resolved_at = EXCLUDED.resolved_at, doc = EXCLUDED.doc",
                [alert.id, alert.started_at, alert.resolved_at, doc],
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
        return {"backend": "postgres", "rows": counts}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return
