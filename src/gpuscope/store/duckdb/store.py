"""The embedded default store: a DuckDB file plus sealed Parquet chunks next to it.

Layout (see ``_schema``): recent raw telemetry lives in a wide DuckDB table (one row per time and
entity, one FLOAT column per metric) where appends are WAL-durable; every ``seal_interval_s`` the
closed rows are sealed into a zstd Parquet piece ordered by entity, and the pieces of each closed
hour are merged into one file (``_chunks``); 1-minute and 1-hour rollups, events,
training records and alerts are DuckDB tables.

Write path: batches are validated and turned into column arrays in the caller's thread
(``prepare``). In durable mode the batch is then appended to the ingest log beside the database
file (``store/ingest_log``: group fsync, one sync for every append that arrived meanwhile) and
``append`` returns once that record is synced; the prepared rows wait in memory and move into
DuckDB in one columnar transaction every ``flush_interval_s`` (5 s: a commit's cost is mostly
per statement, so five ticks in one cost about 40 % of five commits), or once ``flush_rows`` rows
wait, which also records the log position it covers, so a restart replays exactly the
acknowledged batches DuckDB does not hold yet. The columns of new metrics are added at once, in a
transaction of their own, so that the rare, costly DDL never waits for (or lengthens) a tick's
commit. With ``durable=False`` there is no log: appends are buffered and
committed every ``flush_rows`` rows. Either way, every read first commits what is pending.
Snapshots come from an in-memory latest-value cache
(``_latest``); series and aggregates read raw rows or rollups by range (``_planner``, ``_reads``).
Upkeep (``_upkeep``): :meth:`DuckDBStore.rollup` and :meth:`DuckDBStore.compact`, run by the hub.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson

from gpuscope.counters import Counters
from gpuscope.model import Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store.alert_docs import alert_doc, latest
from gpuscope.store.base import AppendResult, Durable, GpuTime, SeriesPoint
from gpuscope.store.batch_ids import BatchIds, Claim
from gpuscope.store.duckdb import gpu_time
from gpuscope.store.duckdb import inserts as ins
from gpuscope.store.duckdb.allocator import ALLOCATOR
from gpuscope.store.duckdb.chunks import BASE_COLUMNS, ChunkSet
from gpuscope.store.duckdb.latest import LatestCache
from gpuscope.store.duckdb.reads import Reader
from gpuscope.store.duckdb.schema import (
    get_meta,
    metric_column_ddl,
    one,
    open_database,
    set_meta,
    training_column_ddl,
)
from gpuscope.store.duckdb.upkeep import COMPACT_CHECKPOINT_WAL_BYTES, CacheBound, Retention, Upkeep
from gpuscope.store.duckdb.watermarks import Watermarks
from gpuscope.store.errors import StoreError, StoreFull, disk_full, write_error
from gpuscope.store.ingest_log import IngestLog
from gpuscope.store.log_codec import decode, encode
from gpuscope.store.memory_size import DEFAULT_CACHE_LIMIT, DEFAULT_MEMORY_LIMIT, size_bytes
from gpuscope.store.prepare import Prepared, Preparer, RowBlock, to_ms
from gpuscope.store.registry import ATTR_COLUMNS, ColumnRegistry, EntityRegistry
from gpuscope.store.replay import Scope, check_window
from gpuscope.store.sealing import DEFAULT_SEAL_INTERVAL_S, seal_interval_error

DAY = 86_400.0
CHECKPOINT_TRIES = 10
LOG_POSITION = "ingest_log_seq"  # meta key: the last ingest-log record the tables hold
#: a fold of GPU time also reads minute cells this much older than the previous fold's bound
GPU_TIME_FOLD_MARGIN_S = 3600.0


def _reached(taken: list[tuple[int, int, Prepared]]) -> dict[int, int]:
    """The last record of each origin's log among batches ``taken`` from it."""
    reached: dict[int, int] = {}
    for origin, seq, _ in taken:
        reached[origin] = max(seq, reached.get(origin, 0))
    return reached


def _count(cur: duckdb.DuckDBPyConnection, table: str) -> int:
    row = one(cur, f"SELECT count(*) FROM {table}")
    return int(row[0]) if row else 0


class DuckDBStore:
    """:class:`gpuscope.store.base.Store` on an embedded DuckDB file (or ``:memory:``).

    An in-memory store keeps all raw rows in its hot table (there is no directory for chunks).
    ``memory_limit`` bounds DuckDB's buffer pool of a file store (``None``: DuckDB's default);
    ``cache_limit`` the cached table blocks it keeps after each upkeep (with a ``memory_limit``).
    """

    def __init__(
        self,
        path: str = ":memory:",
        *,
        max_entities: int = 100_000,
        max_metrics: int = 512,
        raw_retention_s: float = 7 * DAY,
        durable: bool = True,
        counters: Counters | None = None,
        rollup_1m_retention_s: float = 90 * DAY,
        rollup_1h_retention_s: float = 730 * DAY,
        record_retention_s: float = 90 * DAY,
        seal_interval_s: float = DEFAULT_SEAL_INTERVAL_S,
        rollup_lag_s: float = 10.0,
        flush_rows: int = 200_000,
        flush_interval_s: float = 5.0,
        log_reserve_bytes: int = 1 << 20,
        checkpoint_bytes: int = 128 * 1024 * 1024,
        compact_checkpoint_bytes: int = COMPACT_CHECKPOINT_WAL_BYTES,
        batch_id_capacity: int = 1_000_000,
        batch_id_ttl_s: float = DAY,
        latest_window_s: float = 600.0,
        memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
        cache_limit: str = DEFAULT_CACHE_LIMIT,
    ) -> None:
        if max_entities < 1 or max_metrics < 1:
            raise ValueError("max_entities and max_metrics must be at least 1")
        why = seal_interval_error(seal_interval_s)
        if why is not None:
            raise ValueError(f"seal_interval_s: {why}")
        self.path = path
        self.durable = durable and path != ":memory:"
        self.counters = counters if counters is not None else Counters()
        self.flush_rows = flush_rows
        # Lock order: maintenance -> ddl -> commit -> (watermarks | alert | view).
        self._maint_lock = threading.Lock()
        self._ddl_lock = threading.Lock()  # new columns vs. upkeep transactions writing the same tables
        self._commit_lock = threading.Lock()  # one write transaction of the writer at a time
        self._alert_lock = threading.Lock()
        self._view_lock = threading.Lock()  # chunk list + watermarks change atomically for readers
        self._cursor_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._buffer_lock = threading.Lock()
        # (ingest-log sequence number, or 0 without a log; prepared batch), in log order
        self._buffer: list[tuple[int, Prepared]] = []
        #: batches taken from other processes' logs (ingest workers): (origin, seq, prepared),
        #: durable there already, committed with the position they reach in their origin's log
        self._taken: list[tuple[int, int, Prepared]] = []
        self._buffer_rows = 0
        #: origin -> the last record of its log that the tables hold (:meth:`origin_position`)
        self._origins: dict[int, int] = {}
        self._closed = False
        self._closing = False  # the flusher thread stops
        self._schema_due = False  # acknowledged batches bring metric columns the tables lack
        self._folded_before = -math.inf  # GPU time: the bound of this process's last fold
        self.entities = EntityRegistry(max_entities)
        self.columns = ColumnRegistry(max_metrics)
        self.train_columns = ColumnRegistry(max_metrics)
        self.latest = LatestCache()
        self.batch_ids = BatchIds(batch_id_capacity, batch_id_ttl_s)
        self.chunks = ChunkSet(None if path == ":memory:" else Path(path + ".chunks"))
        self.marks = Watermarks()
        # DuckDB's own default is 80 % of the machine's RAM, and its buffer pool keeps the blocks
        # of everything written until it gets there: a hub's RSS grew with its data for hours.
        # Evicted blocks of a file store are read back from disk; an in-memory store has no disk.
        self._con = open_database(path, checkpoint_bytes, memory_limit if path != ":memory:" else None)
        try:
            self._load(latest_window_s)
        except (duckdb.Error, ValueError, orjson.JSONDecodeError) as exc:
            self._con.close()
            raise StoreError(f"{path}: gpuscope store is damaged and cannot be loaded: {exc}") from None
        except StoreError:
            self._con.close()
            raise
        self._preparer = Preparer(self.entities, self.columns, self.train_columns)
        self._wcon = self._con.cursor()
        self._reader = Reader(
            self._cursor,
            self.entities,
            self.columns,
            self.train_columns,
            self.latest,
            self.chunks,
            self.marks,
            self._view_lock,
        )
        retention = Retention(
            int(raw_retention_s * 1000),
            int(rollup_1m_retention_s * 1000),
            int(rollup_1h_retention_s * 1000),
            record_retention_s,
            batch_id_capacity,
            batch_id_ttl_s,
        )
        self._upkeep = Upkeep(
            self._con.cursor(),
            self.chunks,
            self.marks,
            self.columns.persisted,
            self._upkeep_checkpoint,
            self._wal_bytes,
            compact_checkpoint_bytes,
            self._commit_lock,
            self._view_lock,
            int(seal_interval_s * 1000),
            int(rollup_lag_s * 1000),
            retention,
            # a file store's cached blocks are shed each upkeep; an in-memory store has no disk
            CacheBound(size_bytes(cache_limit), memory_limit)
            if memory_limit is not None and path != ":memory:"
            else None,
        )
        self.flush_interval_s = flush_interval_s
        self._log: IngestLog | None = None
        self._flusher: threading.Thread | None = None
        self._wake = threading.Condition()
        if self.durable:
            try:
                self._open_log(log_reserve_bytes)
            except BaseException:
                self._con.close()
                raise
            self._flusher = threading.Thread(
                target=self._flush_loop, name="gpuscope-store-flush", daemon=True
            )
            self._flusher.start()

    def _open_log(self, reserve_bytes: int) -> None:
        """Replay the acknowledged batches the tables do not hold yet, then accept appends."""
        stored = get_meta(self._con, LOG_POSITION)
        if stored is None:  # the row each tick's commit updates
            set_meta(self._con, LOG_POSITION, "0")
        position = int(stored or 0)
        log = IngestLog(Path(self.path + ".log"), self.counters, reserve_bytes=reserve_bytes)
        now = time.time()
        replayed = 0
        for seq, payload in log.recover(position):
            batch = decode(payload)
            if batch.batch_id is not None:
                self.batch_ids.load([(batch.batch_id, now)])
            self._buffer.append((seq, self._preparer.prepare(batch)))
            replayed += 1
        self.counters.inc("store.log_replayed_batches", replayed)
        log.start()
        self._log = log
        if replayed:
            # a failure (a full disk) leaves them pending, in memory and in the log, for the flusher
            with contextlib.suppress(StoreError):
                self._flush()

    # ------------------------------------------------------------------ opening

    def _load(self, latest_window_s: float) -> None:
        con = self._con
        rows = con.execute("SELECT id, labels FROM entities").fetchall()
        self.entities.load((int(i), orjson.loads(lbl)) for i, lbl in rows)
        self.columns.load(
            (str(n), int(c)) for n, c in con.execute("SELECT name, col FROM metric_columns").fetchall()
        )
        self.train_columns.load(
            (str(n), int(c)) for n, c in con.execute("SELECT name, col FROM training_columns").fetchall()
        )
        self.marks.load(con)
        row = one(con, "SELECT coalesce(max(seq), 0) FROM batch_ids")
        self._batch_seq = int(row[0]) + 1 if row else 1
        recent = con.execute(
            "SELECT id, received FROM batch_ids WHERE received >= ? ORDER BY seq DESC LIMIT ?",
            [time.time() - self.batch_ids.ttl_s, self.batch_ids.capacity],
        ).fetchall()
        self.batch_ids.load((str(i), float(r)) for i, r in reversed(recent))
        self.chunks.load(con.execute("SELECT file, lo, hi, rows, bytes, cols FROM chunks").fetchall())
        self._load_latest(int(latest_window_s * 1000))

    def _load_latest(self, window_ms: int) -> None:
        """Rebuild the latest-value cache from the last ``window_ms`` of raw rows."""
        cols = self.columns.persisted()
        row = one(self._con, "SELECT max(ts) FROM samples")
        hot = [int(row[0])] if row and row[0] is not None else []
        newest = max([c.hi - 1 for c in self.chunks.all()] + hot, default=None)
        if not cols or newest is None:
            return
        since = newest - window_ms
        src, params = self.chunks.source(
            [*BASE_COLUMNS, *(f"m{c}" for c in cols)], "ts >= ?", [since], since, None
        )
        aggs = ", ".join(
            f"arg_max(m{c}, ts) FILTER (WHERE m{c} IS NOT NULL), max(ts) FILTER (WHERE m{c} IS NOT NULL)"
            for c in cols
        )
        attrs = ", ".join(f"arg_max({a}, ts)" for a in ATTR_COLUMNS)
        rows = self._con.execute(
            f"SELECT entity, {attrs}, {aggs} FROM ({src}) GROUP BY entity", params
        ).fetchall()
        if not rows:
            return
        na = len(ATTR_COLUMNS)
        entity = np.array([r[0] for r in rows], dtype=np.int32)
        codes = np.array([self.entities.attr_code(tuple(r[1 : 1 + na])) for r in rows], dtype=np.int32)
        for j, c in enumerate(cols):
            value_at, ts_at = 1 + na + 2 * j, 2 + na + 2 * j
            seen = np.array([r[ts_at] is not None for r in rows], dtype=bool)
            if seen.any():
                ts = np.array([r[ts_at] for r in rows if r[ts_at] is not None], dtype=np.int64)
                values = np.array([[r[value_at]] for r in rows if r[ts_at] is not None], dtype=np.float64)
                self.latest.update((c,), ts, entity[seen], codes[seen], values)

    # ------------------------------------------------------------------ append

    def append(self, batch: Batch) -> AppendResult:
        """Store a batch; in durable mode it returns once the batch is committed to the WAL."""
        self._check_open()
        bid = batch.batch_id
        if bid is not None and self.batch_ids.claim(bid) is Claim.DUPLICATE:
            self.counters.inc("store.duplicate_batches")
            return AppendResult(duplicate=True)
        stored = False
        try:
            prepared = self._preparer.prepare(batch)
            self.counters.inc("store.refused_entities", prepared.result.refused_entities)
            self.counters.inc("store.refused_samples", prepared.result.refused_samples)
            if self._log is not None:
                self._log_append(self._log, batch, prepared)
            else:
                self._buffer_append(prepared)
            stored = True
            return prepared.result
        finally:
            if bid is not None:
                self.batch_ids.finish(bid, stored, time.time())

    def append_then(self, batch: Batch, durable: Durable) -> bool:
        """:meth:`append` without waiting for the sync: the batch is prepared and its record
        written when this returns, and ``durable`` gets the result once the record is synced (from
        the ingest log's sync thread), or the error. Without the log, the batch is buffered and
        ``durable`` called at once, as :meth:`append` would return."""
        self._check_open()
        bid = batch.batch_id
        if bid is not None and self.batch_ids.claim(bid) is Claim.DUPLICATE:
            self.counters.inc("store.duplicate_batches")
            durable(AppendResult(duplicate=True))
            return True
        log = self._log
        try:
            prepared = self._preparer.prepare(batch)
            self.counters.inc("store.refused_entities", prepared.result.refused_entities)
            self.counters.inc("store.refused_samples", prepared.result.refused_samples)
            if log is None:
                self._buffer_append(prepared)
            else:
                seq = self._log_write(log, batch, prepared, log.write)
        except BaseException:
            if bid is not None:
                self.batch_ids.finish(bid, False, time.time())
            raise
        if log is None:
            if bid is not None:
                self.batch_ids.finish(bid, True, time.time())
            durable(prepared.result)
            return True

        def synced(error: OSError | None) -> None:
            if bid is not None:
                self.batch_ids.finish(bid, error is None, time.time())
            if error is not None:
                durable(write_error("append failed", error))
                return
            self._written()
            durable(prepared.result)

        log.when_synced(seq, synced)
        return True

    def origin_position(self, origin: int) -> int:
        """The last record of log ``origin`` (an ingest worker's) that the tables hold: its reader
        resumes after it (on a restart, this is the replay of that log)."""
        known = self._origins.get(origin)
        if known is not None:  # kept by each commit: no wait for the one under way
            return known
        with self._commit_lock:
            if origin not in self._origins:
                key = f"{LOG_POSITION}.{origin}"
                stored = get_meta(self._wcon, key)
                if stored is None:  # the row each commit of its records updates
                    set_meta(self._wcon, key, "0")
                self._origins[origin] = int(stored or 0)
            return self._origins[origin]

    def take_logged(self, batch: Batch, origin: int, seq: int) -> AppendResult:
        """A batch that another process already made durable, record ``seq`` of log ``origin``
        (:meth:`origin_position` first): de-duplicated by its id here, where it is consumed (a
        retry may reach another writer), and pending for the next commit, which records how far
        into that log the tables reach."""
        self._check_open()
        bid = batch.batch_id
        if bid is not None and self.batch_ids.claim(bid) is Claim.DUPLICATE:
            self.counters.inc("store.duplicate_batches")
            with self._buffer_lock:  # the position moves past it all the same
                self._taken.append((origin, seq, self._preparer.prepare(Batch(batch.source))))
            return AppendResult(duplicate=True)
        stored = False
        try:
            prepared = self._preparer.prepare(batch)
            self.counters.inc("store.refused_entities", prepared.result.refused_entities)
            self.counters.inc("store.refused_samples", prepared.result.refused_samples)
            with self._buffer_lock:
                self._taken.append((origin, seq, prepared))
                self._buffer_rows += prepared.rows
            if prepared.columns or prepared.train_columns:
                with self._wake:
                    self._schema_due = True
                    self._wake.notify()
            stored = True
        finally:
            if bid is not None:
                self.batch_ids.finish(bid, stored, time.time())
        self._written()
        return prepared.result

    def has_batch(self, batch_id: str) -> bool:
        """Whether a batch with this id was stored (a remote store asks before writing telemetry)."""
        return batch_id in self.batch_ids

    def stored_ids(self, batch_ids: list[str]) -> set[str]:
        """Which of these batch ids were stored (a remote store's tick asks for all at once)."""
        return {bid for bid in batch_ids if bid in self.batch_ids}

    def append_many(self, batches: list[Batch]) -> list[AppendResult]:
        """:meth:`append` of each (a remote store's tick of events, training records and ids)."""
        return [self.append(batch) for batch in batches]

    def _buffer_append(self, prepared: Prepared) -> None:
        with self._buffer_lock:
            self._buffer.append((0, prepared))
            self._buffer_rows += prepared.rows
            full = self._buffer_rows >= self.flush_rows
        if full:
            self._flush()

    def _log_append(self, log: IngestLog, batch: Batch, prepared: Prepared) -> None:
        """Durable on return: the batch's record is synced in the ingest log."""
        self._log_write(log, batch, prepared, log.append)
        self._written()

    def _log_write(
        self,
        log: IngestLog,
        batch: Batch,
        prepared: Prepared,
        write: Callable[[bytes, Callable[[int], None]], int],
    ) -> int:
        """The batch's record, by ``write`` (:meth:`IngestLog.append`: synced on return;
        :meth:`IngestLog.write`: written), its rows pending for the next commit; its number."""
        if not log.has_reserve() and not log.restore_reserve():
            # the disk is still full: refuse before writing rather than eat into what remains
            raise StoreFull(f"append failed: {os.strerror(errno.ENOSPC)} (the ingest log's reserve)")

        def pending(seq: int) -> None:
            with self._buffer_lock:
                self._buffer.append((seq, prepared))
                self._buffer_rows += prepared.rows

        record = encode(batch)
        batch.wire = None  # the record holds it: not kept while the detectors hold the batch
        try:
            seq = write(record, pending)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                # what is acknowledged goes into the tables now, in the reserve's space, so that
                # reads keep seeing it while the disk stays full
                log.release_reserve()
                with contextlib.suppress(StoreError):
                    self._flush()
            raise write_error("append failed", exc) from None
        if prepared.columns or prepared.train_columns:
            with self._wake:
                self._schema_due = True
                self._wake.notify()
        return seq

    def _written(self) -> None:
        """After a durable append: wake the commit when enough rows wait, and commit here, slowing
        the sender down, when the tables fall far behind."""
        if self._buffer_rows >= self.flush_rows:
            with self._wake:
                self._wake.notify()
            if self._buffer_rows >= 4 * self.flush_rows:  # the tables fall behind: slow senders down
                with contextlib.suppress(StoreError):
                    self._flush()

    def _flush_loop(self) -> None:
        """Commit what the log holds into the tables every ``flush_interval_s`` (or once
        ``flush_rows`` wait); add new metrics' columns at once."""
        due = time.monotonic() + self.flush_interval_s
        while True:
            with self._wake:
                while not (self._closing or self._schema_due or self._buffer_rows >= self.flush_rows):
                    left = due - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                if self._closing:
                    return
                schema, self._schema_due = self._schema_due, False
            # a failure is counted; the rows stay pending, in memory and in the log, and are retried
            with contextlib.suppress(StoreError):
                if schema:
                    self._add_columns()
                if self._buffer_rows >= self.flush_rows or time.monotonic() >= due:
                    due = time.monotonic() + self.flush_interval_s
                    self._flush()

    def _add_columns(self) -> None:
        """The columns that pending batches need and the tables lack, in a transaction of their
        own (no rows: the tick's commit brings those)."""
        with self._flush_lock:
            with self._buffer_lock:
                prepared = [p for _, p in self._buffer] + [p for _, _, p in self._taken]
            new_cols = self.columns.unpersisted(set().union(*(p.columns for p in prepared)))
            new_tcols = self.train_columns.unpersisted(set().union(*(p.train_columns for p in prepared)))
            if not new_cols and not new_tcols:
                return
            con = self._wcon
            try:
                with self._ddl_lock, self._commit_lock:
                    con.execute("BEGIN")
                    try:
                        self._add_column_ddl(con, new_cols, new_tcols)
                        con.execute("COMMIT")
                    except BaseException:
                        with contextlib.suppress(duckdb.Error):
                            con.execute("ROLLBACK")
                        raise
            except duckdb.Error as exc:  # the tick's commit adds them (or fails) with its rows
                self.counters.inc("store.column_commit_failures")
                raise write_error("adding metric columns failed", exc) from None
            self.columns.mark_persisted(c for c, _ in new_cols)
            self.train_columns.mark_persisted(c for c, _ in new_tcols)
            self.counters.inc("store.column_commits")

    @staticmethod
    def _add_column_ddl(
        con: duckdb.DuckDBPyConnection, new_cols: list[tuple[int, str]], new_tcols: list[tuple[int, str]]
    ) -> None:
        for col, name in new_cols:
            for stmt in metric_column_ddl(col):
                con.execute(stmt)
            con.execute("INSERT INTO metric_columns VALUES (?, ?)", [name, col])
        for col, name in new_tcols:
            for stmt in training_column_ddl(col):
                con.execute(stmt)
            con.execute("INSERT INTO training_columns VALUES (?, ?)", [name, col])

    def _flush(self) -> None:
        """Commit pending batches in one transaction; reads call it so they see every append.

        With the log, only records already synced are taken (the others are not acknowledged
        yet), and a failed commit keeps them pending; without it, a failed flush loses them
        (counted). Batches taken from other logs (:meth:`take_logged`) are durable there: all of
        them go, and a failed commit keeps them pending too."""
        log = self._log
        with self._flush_lock:
            with self._buffer_lock:
                if log is None:
                    items, self._buffer, self._buffer_rows = self._buffer, [], 0
                else:
                    synced = log.synced
                    k = len(self._buffer)
                    while k and self._buffer[k - 1][0] > synced:
                        k -= 1
                    items, self._buffer = self._buffer[:k], self._buffer[k:]
                    self._buffer_rows -= sum(p.rows for _, p in items)
                taken, self._taken = self._taken, []
                self._buffer_rows -= sum(p.rows for _, _, p in taken)
            if not items and not taken:
                return
            position = items[-1][0] if items else 0
            origins = _reached(taken)
            batch = [p for _, p in items] + [p for _, _, p in taken]
            try:
                try:
                    self._commit(batch, position, origins)
                except duckdb.Error as exc:
                    if log is None or not disk_full(exc):
                        raise
                    if not log.release_reserve():
                        raise
                    self._commit(batch, position, origins)  # in the space the reserve held
            except duckdb.Error as exc:
                if log is None and not taken:
                    self.counters.inc("store.lost_buffered_batches", len(items))
                elif not disk_full(exc) and len(batch) > 1:
                    self._commit_one_by_one(items, taken)
                    if log is not None and items:
                        log.release(position)
                    return
                else:
                    self.counters.inc("store.flush_failures")
                    if log is None:
                        self.counters.inc("store.lost_buffered_batches", len(items))
                    with self._buffer_lock:
                        if log is not None:
                            self._buffer[:0] = items
                            self._buffer_rows += sum(p.rows for _, p in items)
                        self._taken[:0] = taken
                        self._buffer_rows += sum(p.rows for _, _, p in taken)
                raise write_error(f"committing {len(batch)} pending batches failed", exc) from None
            if log is not None and items:
                log.release(position)

    def _commit_one_by_one(
        self, items: list[tuple[int, Prepared]], taken: list[tuple[int, int, Prepared]] | None = None
    ) -> None:
        """After a failed group: each batch alone, so that one the tables refuse (validation
        should have refused it) cannot hold back the others; it is counted, not retried forever."""
        alone: list[tuple[Prepared, int, dict[int, int] | None]] = [(p, seq, None) for seq, p in items]
        alone += [(p, 0, {origin: seq}) for origin, seq, p in taken or []]
        for prepared, seq, origins in alone:
            try:
                self._commit([prepared], seq, origins)
            except duckdb.Error:
                self.counters.inc("store.unstorable_batches")
                self._commit([], seq, origins)  # past it, so a restart does not replay it either

    def _commit(
        self, items: list[Prepared], position: int = 0, origins: dict[int, int] | None = None
    ) -> None:
        """One transaction for all ``items``, and the ingest-log position they reach (``origins``:
        the position they reach in each other log they were taken from)."""
        blocks: dict[tuple[int, ...], RowBlock] = {}
        for item in items:
            for key, block in item.blocks.items():
                if key in blocks:
                    blocks[key].merge(block)
                else:
                    blocks[key] = RowBlock(
                        key, [*block.ts], [*block.entity], [*block.attr], [*block.values], block.rows
                    )
        new_cols = self.columns.unpersisted(set().union(*(i.columns for i in items)))
        new_tcols = self.train_columns.unpersisted(set().union(*(i.train_columns for i in items)))
        new_ents = self.entities.unpersisted(sorted(set().union(*(i.entities for i in items))))
        ids = [i.batch_id for i in items if i.batch_id is not None]
        arrays = {key: ins.concat(b) for key, b in blocks.items()}
        ddl = self._ddl_lock if (new_cols or new_tcols) else contextlib.nullcontext()
        con = self._wcon
        with ddl, self._commit_lock, self.marks.lock:
            con.execute("BEGIN")
            try:
                self._add_column_ddl(con, new_cols, new_tcols)
                if new_ents:
                    ins.insert_entities(con, new_ents)
                attr_arrays = self.entities.attr_arrays()
                if arrays:
                    cols, (ts, ent, attr, vals) = ins.union(arrays)
                    ins.insert_rows(con, cols, ts, ent, attr, vals, attr_arrays)
                late, too_old = self.marks.late_buckets([a[0] for a in arrays.values()])
                self.counters.inc("store.late_buckets_past_raw_retention", too_old)
                if len(late):
                    ins.insert_buckets(con, late)
                events = [e for i in items for e in i.events]
                if events:
                    ins.insert_events(con, events)
                training = [t for i in items for t in i.training]
                if training:
                    ins.insert_training(con, training)
                if ids:
                    ins.insert_batch_ids(con, ids, time.time(), self._batch_seq)
                if position:
                    # an UPDATE of the existing row: INSERT OR REPLACE cost about 3 ms more a commit
                    con.execute("UPDATE meta SET value = ? WHERE key = ?", [str(position), LOG_POSITION])
                for origin, seq in (origins or {}).items():
                    con.execute(
                        "UPDATE meta SET value = ? WHERE key = ?", [str(seq), f"{LOG_POSITION}.{origin}"]
                    )
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            self._batch_seq += len(ids)
            self._origins.update(origins or {})
        self.columns.mark_persisted(c for c, _ in new_cols)
        self.train_columns.mark_persisted(c for c, _ in new_tcols)
        self.entities.mark_persisted(e for e, _ in new_ents)
        for key, (ts, ent, attr, vals) in arrays.items():
            self.latest.update(key, ts, ent, attr, vals)
        self.counters.inc("store.commits")
        self.counters.inc("store.samples", sum(i.result.samples for i in items))

    # ------------------------------------------------------------------ upkeep

    @contextlib.contextmanager
    def _maintenance(self, what: str) -> Iterator[None]:
        self._check_open()
        self._flush()
        with self._maint_lock, self._ddl_lock:
            try:
                yield
            except duckdb.Error as exc:
                raise StoreError(f"{what} failed: {exc}") from None

    def rollup(self, now: float) -> dict[str, int]:
        """Seal closed raw rows into Parquet pieces (merging each closed hour's) and bring the
        1-minute and 1-hour rollups up to ``now`` (any clock: epoch or simulated seconds).
        Idempotent. A bucket closes ``rollup_lag_s`` after its end; rows arriving later for it
        mark it for recomputation."""
        with self._maintenance("rollup"):
            return self._upkeep.rollup(to_ms(now))

    def compact(self, now: float) -> dict[str, int]:
        """Apply retention: raw rows past ``raw_retention_s`` (only once rolled up: run
        :meth:`rollup` first; sealed chunks go whole), rollups, events, training records and
        resolved alerts past theirs, and expired batch ids."""
        with self._maintenance("compaction"):
            return self._upkeep.compact(to_ms(now))

    def checkpoint(self) -> None:
        """Write everything to the database file and truncate the WAL."""
        self._check_open()
        self._flush()
        with self._maintenance("checkpoint"):
            self._checkpoint(self._upkeep.con)

    def _checkpoint(self, con: duckdb.DuckDBPyConnection) -> None:
        # DuckDB refuses to checkpoint while another write transaction is open: pause the writer.
        with self._commit_lock, self._alert_lock:
            con.execute("CHECKPOINT")

    def _wal_bytes(self) -> int:
        wal = self.path + ".wal"
        return os.path.getsize(wal) if self.path != ":memory:" and os.path.exists(wal) else 0

    def _upkeep_checkpoint(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Checkpoint after upkeep. DuckDB may refuse while a query that started before the
        upkeep's changes is still running; such queries are short, so retry for a while, then
        leave it to the next upkeep (counted) rather than fail."""
        for attempt in range(CHECKPOINT_TRIES):
            try:
                self._checkpoint(con)
                return True
            except duckdb.TransactionException:
                time.sleep(0.02 * (attempt + 1))
        self.counters.inc("store.checkpoints_deferred")
        return False

    # ------------------------------------------------------------------ reads

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        self._check_open()
        with self._cursor_lock:
            return self._con.cursor()

    def _ready(self) -> Reader:
        self._check_open()
        self._flush()
        return self._reader

    def series(
        self, metric: str, labels: Labels, start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]:
        """Mean per bucket of ``metric`` over the rows ``labels`` select (all their entities when
        several match), at most ``points`` buckets in [start, end]; raw rows or rollups by range."""
        return self._ready().series(metric, labels, start, end, points)

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        """Mean, min, max and count of ``metric`` per value of label ``by`` over [start, end];
        entities without that label are left out."""
        return self._ready().aggregate(metric, by, start, end)

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        """Newest value of each metric per entity, from memory. ``max_age`` counts back from the
        newest sample in the store (not the wall clock, so simulated time works the same)."""
        return self._ready().snapshot(metrics, max_age)

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """Events in [start, end], oldest first; the newest ``limit`` when there are more."""
        return self._ready().events(start, end, kind, labels, limit)

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]:
        """A job's training records in [start, end], oldest first; the newest ``limit`` when
        there are more."""
        return self._ready().training(job, start, end, rank, limit)

    def replay(
        self,
        start: float,
        end: float,
        nodes: Iterable[str] | None = None,
        jobs: Iterable[str] | None = None,
    ) -> Iterator[Batch]:
        """Raw telemetry, events and training records of [start, end] as time-ordered batches."""
        check_window(start, end)
        return self._ready().replay(start, end, Scope.of(nodes, jobs))

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        """Alerts, newest start first. ``save_alert`` writes them at once, not through the pending
        telemetry, so reading them commits nothing: a client polling alerts every second does not
        turn the store's commit every ``flush_interval_s`` into one a second."""
        self._check_open()
        return self._reader.alerts(firing_only, limit)

    def save_alert(self, alert: Alert) -> None:
        """Insert or update an alert (keyed by its id), durably."""
        self.save_alerts([alert])

    def save_alerts(self, alerts: Sequence[Alert]) -> None:
        """Insert or update alerts (keyed by id) in one statement and transaction, durably.

        Each INSERT costs DuckDB a transaction (about 4 ms CPU, more on a file), so an evaluation
        that fires hundreds of alerts writes them together. The documents are made under the
        alert lock: of two threads saving one alert, the later commit holds the later state."""
        unique = latest(alerts)
        if not unique:
            return
        cur = self._cursor()
        try:
            with self._alert_lock:
                cur.execute(
                    "INSERT OR REPLACE INTO alerts SELECT unnest(?::VARCHAR[]), unnest(?::DOUBLE[]), "
                    "unnest(?::DOUBLE[]), unnest(?::VARCHAR[])",
                    [
                        [a.id for a in unique],
                        [a.started_at for a in unique],
                        [a.resolved_at for a in unique],
                        [alert_doc(a) for a in unique],
                    ],
                )
        except duckdb.Error as exc:
            ids = unique[0].id if len(unique) == 1 else f"{unique[0].id} .. {unique[-1].id} ({len(unique)})"
            raise StoreError(f"saving alert {ids!r} failed: {exc}") from None
        finally:
            cur.close()
        self.counters.inc("store.alert_writes")

    def save_gpu_time(self, cells: list[GpuTime]) -> None:
        """Insert or replace minute cells of the productivity model's GPU time, durably."""
        self._gpu_time_write("saving GPU time", lambda cur: gpu_time.save(cur, cells))

    def fold_gpu_time(self, before: float) -> int:
        """Fold minute cells of GPU time ending by ``before`` into hour cells.

        The first fold of a process reads every minute cell; later ones only those from an hour
        before the previous fold's ``before`` on (cells saved late, or by another hub sharing the
        store, land there), so each minute's fold reads its window, not the table."""
        since = self._folded_before - GPU_TIME_FOLD_MARGIN_S
        folded: list[int] = []
        self._gpu_time_write("folding GPU time", lambda cur: folded.append(gpu_time.fold(cur, before, since)))
        self._folded_before = max(self._folded_before, before)
        return folded[0]

    def gpu_time(self, start: float, end: float) -> list[GpuTime]:
        """Minute and hour cells of GPU time overlapping ``[start, end)``."""
        cur = self._cursor()
        try:
            return gpu_time.read(cur, start, end)
        except duckdb.Error as exc:
            raise StoreError(f"reading GPU time failed: {exc}") from None
        finally:
            cur.close()

    def _gpu_time_write(self, what: str, write: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
        cur = self._cursor()
        try:
            with self._alert_lock:  # like alerts: small writes a checkpoint must not run into
                write(cur)
        except duckdb.Error as exc:
            raise StoreError(f"{what} failed: {exc}") from None
        finally:
            cur.close()

    def memory(self) -> dict[str, int]:
        """DuckDB's own memory accounting (buffer pool, caches) in bytes, by tag."""
        cur = self._cursor()
        try:
            rows = cur.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
        finally:
            cur.close()
        return {str(tag): int(used) for tag, used in rows}

    def stats(self) -> dict[str, Any]:
        """Row counts, bytes on disk (database, WAL, chunk files), refusals and commits."""
        tables = (
            "samples",
            "rollup_1m",
            "rollup_1h",
            "events",
            "training",
            "alerts",
            "entities",
            "batch_ids",
        )
        with self._ready().snapshot_of_now() as snap:
            counts = {t: _count(snap.cur, t) for t in tables}
            size = one(
                snap.cur,
                "SELECT block_size, used_blocks FROM pragma_database_size() "
                "WHERE database_name = current_database()",
            )
        file_bytes = os.path.getsize(self.path) if self.path != ":memory:" else 0
        wal_bytes = self._wal_bytes()
        chunks = self.chunks.all()
        log = self._log_stats()
        log_bytes = log["bytes"] if log is not None else 0
        return {
            "path": self.path,
            "durable": self.durable,
            "rows": counts,
            "raw_rows": counts["samples"] + sum(c.rows for c in chunks),
            "chunk_files": len(chunks),
            "chunk_bytes": sum(c.bytes for c in chunks),
            "entities": len(self.entities),
            "metrics": len(self.columns),
            "training_metrics": len(self.train_columns),
            "file_bytes": file_bytes,
            "wal_bytes": wal_bytes,
            "disk_bytes": file_bytes + wal_bytes + sum(c.bytes for c in chunks) + log_bytes,
            "used_bytes": int(size[0]) * int(size[1]) if size else 0,
            "watermarks": self.marks.as_dict(),
            "counters": {k: v for k, v in self.counters.snapshot().items() if k.startswith("store.")},
            "commits": self.counters.get("store.commits"),
            "log": log,
            "memory": self.memory(),
            "allocator": ALLOCATOR.read(),
            "batch_ids_remembered": len(self.batch_ids),
        }

    def _log_stats(self) -> dict[str, int] | None:
        if self._log is None:
            return None
        with self._buffer_lock:
            pending, rows = len(self._buffer) + len(self._taken), self._buffer_rows
        return {
            "bytes": self._log.bytes(),
            "segments": self._log.segments(),
            "pending_batches": pending,
            "pending_rows": rows,
        }

    # ------------------------------------------------------------------ closing

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def close(self) -> None:
        """Commit everything pending and close the files. Safe to call twice."""
        if self._closed:
            return
        if self._flusher is not None:
            with self._wake:
                self._closing = True
                self._wake.notify()
            self._flusher.join()
        self._flush()
        if self._log is not None:
            self._log.close()  # removes the segments when the tables hold every record
        with self._maint_lock, self._commit_lock:
            self._closed = True
            self._wcon.close()
            self._upkeep.con.close()
            self._con.close()
        self.chunks.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
