"""The embedded default store: one DuckDB file holding telemetry, events, training records, alerts.

Appends are prepared (validated, converted to column arrays) in the caller's thread, then a single
writer thread commits everything queued as one transaction (group commit; DuckDB fsyncs its WAL
on commit), so ``append`` returns only once the batch is durable. Snapshots come from an
in-memory latest-value cache; series and aggregates read raw rows or rollups by range.
See ``_schema`` for the table layout and ``_maintenance`` for sealing, rollups and retention.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import duckdb
import numpy as np
import orjson

from gpuscope.counters import Counters
from gpuscope.model import ATTRIBUTION_LABELS, Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store import _inserts as ins
from gpuscope.store import _maintenance as mnt
from gpuscope.store._batch_ids import BatchIds, Claim
from gpuscope.store._chunks import BASE_COLUMNS, Chunk, ChunkSet
from gpuscope.store._latest import LatestCache
from gpuscope.store._planner import Tier, plan
from gpuscope.store._prepare import Prepared, Preparer, RowBlock, to_ms
from gpuscope.store._queries import SELECTED, Filter, aggregate_sql, series_sql
from gpuscope.store._registry import ATTR_COLUMNS, ColumnRegistry, EntityRegistry
from gpuscope.store._schema import (
    get_meta,
    hot_table_swap,
    metric_column_ddl,
    open_database,
    set_meta,
    training_column_ddl,
)
from gpuscope.store._writer import GroupCommitter, WriterClosed
from gpuscope.store.base import AppendResult, SeriesPoint
from gpuscope.store.errors import StoreError

DAY = 86_400.0
LABEL_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _opt_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _count(cur: duckdb.DuckDBPyConnection, table: str) -> int:
    row = cur.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


class DuckDBStore:
    """:class:`gpuscope.store.base.Store` on an embedded DuckDB file (or ``:memory:``)."""

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
        seal_chunk_s: float = 3600.0,
        rollup_lag_s: float = 10.0,
        flush_rows: int = 200_000,
        max_group_rows: int = 2_000_000,
        checkpoint_bytes: int = 128 * 1024 * 1024,
        batch_id_capacity: int = 1_000_000,
        batch_id_ttl_s: float = DAY,
        latest_window_s: float = 600.0,
    ) -> None:
        if max_entities < 1 or max_metrics < 1:
            raise ValueError("max_entities and max_metrics must be at least 1")
        if seal_chunk_s < 60 or seal_chunk_s % 60:
            raise ValueError("seal_chunk_s must be a whole number of minutes")
        self.path = path
        self.durable = durable and path != ":memory:"
        self.counters = counters if counters is not None else Counters()
        self.raw_retention_ms = int(raw_retention_s * 1000)
        self.m_retention_ms = int(rollup_1m_retention_s * 1000)
        self.h_retention_ms = int(rollup_1h_retention_s * 1000)
        self.record_retention_s = record_retention_s
        self.seal_chunk_ms = int(seal_chunk_s * 1000)
        self.lag_ms = int(rollup_lag_s * 1000)
        self.flush_rows = flush_rows
        self._con = open_database(path, checkpoint_bytes)
        self._cursor_lock = threading.Lock()
        self._commit_lock = threading.Lock()  # one transaction writer at a time
        # Lock order: maintenance -> ddl -> commit -> (wm | alert). The DDL lock keeps new columns
        # out of the tables a maintenance transaction is writing (DuckDB would abort one of them).
        self._ddl_lock = threading.Lock()
        self._wm_lock = threading.Lock()  # late-row marking vs. the start of a rollup snapshot
        self._maint_lock = threading.Lock()
        self._alert_lock = threading.Lock()
        self._buffer: list[Prepared] = []
        self._buffer_rows = 0
        self._buffer_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._closed = False
        self.entities = EntityRegistry(max_entities)
        self.columns = ColumnRegistry(max_metrics)
        self.train_columns = ColumnRegistry(max_metrics)
        self.latest = LatestCache()
        self.batch_ids = BatchIds(batch_id_capacity, batch_id_ttl_s)
        self.chunks = ChunkSet(None if path == ":memory:" else Path(path + ".chunks"))
        try:
            self._load(latest_window_s)
        except (duckdb.Error, ValueError, orjson.JSONDecodeError) as exc:
            self._con.close()
            raise StoreError(f"{path}: gpuscope store is damaged and cannot be loaded: {exc}") from None
        self._preparer = Preparer(self.entities, self.columns, self.train_columns)
        self._wcon = self._con.cursor()
        self._mcon = self._con.cursor()
        self._writer: GroupCommitter[Prepared, AppendResult] | None = None
        if self.durable:
            self._writer = GroupCommitter(self._commit, lambda p: p.rows, max_group_rows)

    # ------------------------------------------------------------------ opening

    def _load(self, latest_window_s: float) -> None:
        con = self._con
        self.entities.load(
            (int(i), orjson.loads(lbl))
            for i, lbl in con.execute("SELECT id, labels FROM entities").fetchall()
        )
        self.columns.load(
            (str(n), int(c)) for n, c in con.execute("SELECT name, col FROM metric_columns").fetchall()
        )
        self.train_columns.load(
            (str(n), int(c)) for n, c in con.execute("SELECT name, col FROM training_columns").fetchall()
        )
        self._wm_1m = _opt_int(get_meta(con, "wm_1m"))
        self._wm_1h = _opt_int(get_meta(con, "wm_1h"))
        self._wm_pending = self._wm_1m
        self._raw_lo = _opt_int(get_meta(con, "raw_lo"))
        self._m_lo = _opt_int(get_meta(con, "m_lo"))
        self._h_lo = _opt_int(get_meta(con, "h_lo"))
        row = con.execute("SELECT coalesce(max(seq), 0) FROM batch_ids").fetchone()
        self._batch_seq = int(row[0]) + 1 if row else 1
        cutoff = time.time() - self.batch_ids.ttl_s
        self.batch_ids.load(
            (str(i), float(r))
            for i, r in con.execute(
                "SELECT id, received FROM batch_ids WHERE received >= ? ORDER BY seq DESC LIMIT ?",
                [cutoff, self.batch_ids.capacity],
            ).fetchall()[::-1]
        )
        self.chunks.load(con.execute("SELECT file, lo, hi, rows, bytes, cols FROM chunks").fetchall())
        self._load_latest(int(latest_window_s * 1000))

    def _load_latest(self, window_ms: int) -> None:
        """Rebuild the latest-value cache from the last ``window_ms`` of raw rows."""
        cols = self.columns.persisted()
        if not cols:
            return
        row = self._con.execute("SELECT max(ts) FROM samples").fetchone()
        newest = max(
            [c.hi - 1 for c in self.chunks.all()] + ([int(row[0])] if row and row[0] is not None else []),
            default=None,
        )
        if newest is None:
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
            ts = np.array([r[1 + na + 2 * j + 1] for r in rows], dtype=object)
            seen = np.array([t is not None for t in ts], dtype=bool)
            if seen.any():
                values = np.array(
                    [[r[1 + na + 2 * j]] for r, s in zip(rows, seen, strict=True) if s], dtype=np.float64
                )
                self.latest.update((c,), ts[seen].astype(np.int64), entity[seen], codes[seen], values)

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
            self._count_refusals(prepared.result)
            if self._writer is not None:
                try:
                    result = self._writer.submit(prepared).result()
                except WriterClosed:
                    raise StoreError("the store is closed") from None
                except duckdb.Error as exc:
                    raise StoreError(f"append failed: {exc}") from None
            else:
                result = self._buffer_append(prepared)
            stored = True
            return result
        finally:
            if bid is not None:
                self.batch_ids.finish(bid, stored, time.time())

    def _count_refusals(self, result: AppendResult) -> None:
        self.counters.inc("store.refused_entities", result.refused_entities)
        self.counters.inc("store.refused_samples", result.refused_samples)

    def _buffer_append(self, prepared: Prepared) -> AppendResult:
        with self._buffer_lock:
            self._buffer.append(prepared)
            self._buffer_rows += prepared.rows
            full = self._buffer_rows >= self.flush_rows
        if full:
            self._flush()
        return prepared.result

    def _flush(self) -> None:
        """Commit buffered batches (non-durable mode); queries call it so they see every append."""
        if self._writer is not None:
            return
        with self._flush_lock:
            with self._buffer_lock:
                items, self._buffer, self._buffer_rows = self._buffer, [], 0
            if not items:
                return
            try:
                self._commit(items)
            except duckdb.Error as exc:
                self.counters.inc("store.lost_buffered_batches", len(items))
                raise StoreError(f"flushing {len(items)} buffered batches failed: {exc}") from None

    def _commit(self, items: list[Prepared]) -> list[AppendResult]:
        """One transaction for all ``items`` (runs on the writer thread, or under the commit lock)."""
        blocks: dict[tuple[int, ...], RowBlock] = {}
        for item in items:
            for key, block in item.blocks.items():
                if key in blocks:
                    blocks[key].merge(block)
                else:
                    blocks[key] = RowBlock(
                        key,
                        list(block.ts),
                        list(block.entity),
                        list(block.attr),
                        list(block.values),
                        block.rows,
                    )
        new_cols = self.columns.unpersisted(set().union(*(i.columns for i in items)))
        new_tcols = self.train_columns.unpersisted(set().union(*(i.train_columns for i in items)))
        new_ents = self.entities.unpersisted(sorted(set().union(*(i.entities for i in items))))
        ids = [i.batch_id for i in items if i.batch_id is not None]
        arrays = {key: ins.concat(b) for key, b in blocks.items()}
        ddl = self._ddl_lock if (new_cols or new_tcols) else contextlib.nullcontext()
        con = self._wcon
        with ddl, self._commit_lock, self._wm_lock:
            con.execute("BEGIN")
            try:
                for col, name in new_cols:
                    for stmt in metric_column_ddl(col):
                        con.execute(stmt)
                    con.execute("INSERT INTO metric_columns VALUES (?, ?)", [name, col])
                for col, name in new_tcols:
                    for stmt in training_column_ddl(col):
                        con.execute(stmt)
                    con.execute("INSERT INTO training_columns VALUES (?, ?)", [name, col])
                if new_ents:
                    ins.insert_entities(con, new_ents)
                attr_arrays = self.entities.attr_arrays()
                for key, (ts, ent, attr, vals) in arrays.items():
                    ins.insert_rows(con, key, ts, ent, attr, vals, attr_arrays)
                self._mark_late(con, [a[0] for a in arrays.values()])
                events = [e for i in items for e in i.events]
                if events:
                    ins.insert_events(con, events)
                training = [t for i in items for t in i.training]
                if training:
                    ins.insert_training(con, training)
                if ids:
                    ins.insert_batch_ids(con, ids, time.time(), self._batch_seq)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            if ids:
                self._batch_seq += len(ids)
        self.columns.mark_persisted(c for c, _ in new_cols)
        self.train_columns.mark_persisted(c for c, _ in new_tcols)
        self.entities.mark_persisted(e for e, _ in new_ents)
        for key, (ts, ent, attr, vals) in arrays.items():
            self.latest.update(key, ts, ent, attr, vals)
        self.counters.inc("store.commits")
        self.counters.inc("store.samples", sum(i.result.samples for i in items))
        return [i.result for i in items]

    def _mark_late(self, con: duckdb.DuckDBPyConnection, ts_arrays: list[np.ndarray[Any, Any]]) -> None:
        """Record 1-minute buckets that got rows after their rollup ran (or while it runs)."""
        guard = self._wm_pending
        if guard is None:
            return
        late = [t[t < guard] for t in ts_arrays if len(t) and int(t.min()) < guard]
        if not late:
            return
        buckets = np.unique(np.concatenate(late) // mnt.MINUTE_MS * mnt.MINUTE_MS)
        if self._raw_lo is not None:
            too_old = buckets < self._raw_lo
            self.counters.inc("store.late_rows_not_rolled_up", int(np.count_nonzero(too_old)))
            buckets = buckets[~too_old]
        if len(buckets):
            ins.insert_buckets(con, buckets)

    # ------------------------------------------------------------------ maintenance

    @contextlib.contextmanager
    def _maintenance(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self._check_open()
        self._flush()
        with self._maint_lock, self._ddl_lock:
            yield self._mcon

    def rollup(self, now: float) -> dict[str, int]:
        """Seal closed raw chunks and bring the 1-minute and 1-hour rollups up to ``now``.

        Idempotent. Buckets close ``rollup_lag_s`` after their end; rows that arrive later for a
        rolled-up bucket mark it dirty and it is recomputed on the next call.
        """
        with self._maintenance() as con:
            try:
                return self._rollup(con, to_ms(now))
            except duckdb.Error as exc:
                raise StoreError(f"rollup failed: {exc}") from None

    def _rollup(self, con: duckdb.DuckDBPyConnection, now_ms: int) -> dict[str, int]:
        report = {"sealed_rows": 0, "minute_ranges": 0, "hour_ranges": 0}
        cols = self.columns.persisted()
        cut = (now_ms - self.lag_ms - mnt.MINUTE_MS) // self.seal_chunk_ms * self.seal_chunk_ms
        if (
            self.chunks.enabled
            and con.execute("SELECT 1 FROM samples WHERE ts < ? LIMIT 1", [cut]).fetchone()
        ):
            chunk = self._seal(con, cut, cols)
            report["sealed_rows"] = chunk.rows if chunk else 0
        closed = (now_ms - self.lag_ms) // mnt.MINUTE_MS * mnt.MINUTE_MS
        with self._wm_lock:  # from here on, the writer marks rows below `closed` as late
            start = self._wm_1m
            if start is None:
                row = con.execute("SELECT min(ts) FROM samples").fetchone()
                oldest = [c.lo for c in self.chunks.all()] + (
                    [int(row[0])] if row and row[0] is not None else []
                )
                if not oldest:
                    return report
                start = min(oldest) // mnt.MINUTE_MS * mnt.MINUTE_MS
            self._wm_pending = max(closed, self._wm_1m or closed)
            con.execute("BEGIN")
            dirty = [int(r[0]) for r in con.execute("SELECT DISTINCT bucket FROM rollup_dirty").fetchall()]
        try:
            ranges = [(b, b + mnt.MINUTE_MS) for b in dirty if b < closed]
            if closed > start:
                ranges.append((start, closed))
            ranges = mnt.merge_ranges(ranges)
            for a, b in ranges:
                mnt.rollup_minutes(con, self.chunks, a, b, cols)
            closed_hour = closed // mnt.HOUR_MS * mnt.HOUR_MS
            hours = mnt.hours_of(ranges, closed_hour)
            if self._wm_1h is not None and closed_hour > self._wm_1h:
                hours = mnt.merge_ranges([*hours, (self._wm_1h, closed_hour)])
            for a, b in hours:
                mnt.rollup_hours(con, a, b, cols)
            if dirty:
                con.execute("DELETE FROM rollup_dirty WHERE bucket < ?", [closed])
            new_1m = max(closed, self._wm_1m or closed)
            new_1h = max(closed_hour, self._wm_1h or closed_hour)
            set_meta(con, "wm_1m", str(new_1m))
            set_meta(con, "wm_1h", str(new_1h))
            con.execute("COMMIT")
        except BaseException:
            with self._wm_lock:
                self._wm_pending = self._wm_1m
            con.execute("ROLLBACK")
            raise
        self._wm_1m, self._wm_1h = new_1m, new_1h
        report["minute_ranges"], report["hour_ranges"] = len(ranges), len(hours)
        return report

    def _seal(self, con: duckdb.DuckDBPyConnection, cut: int, cols: list[int]) -> Chunk | None:
        con.execute("BEGIN")
        try:
            chunk = self.chunks.seal(con, cut, cols)
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        if chunk is None:
            return None
        self.chunks.added(chunk)
        with self._commit_lock:  # the writer appends to `samples`: keep it out while the table is replaced
            con.execute("BEGIN")
            try:
                for stmt in hot_table_swap(cols):
                    con.execute(stmt)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
        self._checkpoint(con)
        return chunk

    def compact(self, now: float) -> dict[str, int]:
        """Delete raw rows older than the raw retention (only those already rolled up: call
        :meth:`rollup` first), rollups past theirs, old events, training records and batch ids."""
        now_ms = to_ms(now)
        with self._maintenance() as con:
            try:
                return self._compact(con, now, now_ms)
            except duckdb.Error as exc:
                raise StoreError(f"compaction failed: {exc}") from None

    def _compact(self, con: duckdb.DuckDBPyConnection, now: float, now_ms: int) -> dict[str, int]:
        report: dict[str, int] = {}
        raw_cut = min(now_ms - self.raw_retention_ms, self._wm_1m if self._wm_1m is not None else 0)
        m_cut = min(now_ms - self.m_retention_ms, self._wm_1h if self._wm_1h is not None else 0)
        h_cut = now_ms - self.h_retention_ms
        record_cut = now - self.record_retention_s
        wall = time.time()
        con.execute("BEGIN")
        try:
            expired = self.chunks.expire(con, raw_cut)
            report["chunk_files"] = len(expired)
            report["sealed_rows"] = sum(c.rows for c in expired)
            deletes = {
                "samples": ("DELETE FROM samples WHERE ts < ?", raw_cut),
                "rollup_1m": ("DELETE FROM rollup_1m WHERE bucket < ?", m_cut),
                "rollup_1h": ("DELETE FROM rollup_1h WHERE bucket < ?", h_cut),
                "events": ("DELETE FROM events WHERE ts < ?", record_cut),
                "training": ("DELETE FROM training WHERE ts < ?", record_cut),
                "alerts": ("DELETE FROM alerts WHERE resolved_at < ?", now - self.h_retention_ms / 1000),
            }
            for table, (sql, arg) in deletes.items():
                row = con.execute(sql, [arg]).fetchone()
                report[table] = int(row[0]) if row else 0
            row = con.execute(
                "DELETE FROM batch_ids WHERE received < ? OR seq <= (SELECT max(seq) FROM batch_ids) - ?",
                [wall - self.batch_ids.ttl_s, self.batch_ids.capacity],
            ).fetchone()
            report["batch_ids"] = int(row[0]) if row else 0
            self._raw_lo = max(raw_cut, self._raw_lo or raw_cut)
            self._m_lo = max(m_cut, self._m_lo or m_cut)
            self._h_lo = max(h_cut, self._h_lo or h_cut)
            for key, value in (("raw_lo", self._raw_lo), ("m_lo", self._m_lo), ("h_lo", self._h_lo)):
                set_meta(con, key, str(value))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self.chunks.removed(expired)
        self._checkpoint(con)
        return report

    # ------------------------------------------------------------------ queries

    @contextlib.contextmanager
    def _reader(self, flush: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        self._check_open()
        if flush:
            self._flush()
        with self._cursor_lock:
            cur = self._con.cursor()
        try:
            yield cur
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {exc}") from None
        finally:
            cur.close()

    def _tiers(self) -> list[Tier]:
        tiers = [Tier("raw", 0, self._raw_lo, None)]
        if self._wm_1m is not None:
            tiers.append(Tier("1m", mnt.MINUTE_MS, self._m_lo, self._wm_1m))
        if self._wm_1h is not None:
            tiers.append(Tier("1h", mnt.HOUR_MS, self._h_lo, self._wm_1h))
        return tiers

    def _filter(self, labels: Labels) -> Filter | None:
        """Rows selected by ``labels``; None when no entity can match."""
        identity = {k: v for k, v in labels.items() if k not in ATTRIBUTION_LABELS}
        attribution = {k: v for k, v in labels.items() if k in ATTRIBUTION_LABELS}
        entities = self.entities.match(identity) if identity else None
        if entities is not None and not entities:
            return None
        return Filter(entities, attribution)

    def _column(self, metric: str) -> int | None:
        col = self.columns.get(metric)
        return col if col is not None and col in set(self.columns.persisted()) else None

    @staticmethod
    def _range(start: float, end: float) -> tuple[int, int]:
        if not (math.isfinite(start) and math.isfinite(end)):
            raise ValueError(f"start and end must be finite, got {start!r}, {end!r}")
        if end < start:
            raise ValueError(f"end ({end}) is before start ({start})")
        return to_ms(start), to_ms(end) + 1

    def series(
        self, metric: str, labels: Labels, start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]:
        """Mean per bucket of ``metric`` over the rows ``labels`` select (all their entities when
        several match), at most ``points`` buckets between ``start`` and ``end`` inclusive."""
        if points < 1:
            raise ValueError(f"points must be at least 1, got {points}")
        a, b = self._range(start, end)
        with self._reader() as cur:
            col = self._column(metric)
            flt = self._filter(labels)
            if col is None or flt is None:
                return []
            step = max(1, _ceil_div(b - a, points))
            segments = plan(a, b, step, self._tiers())
            if not segments:
                return []
            origin = a
            res = max((tier.res for tier, _, _ in segments if tier.res <= step), default=0)
            if res:  # whole rollup buckets per point: align the grid and the step to the bucket width
                origin = a // res * res
                step = _ceil_div(_ceil_div(b - origin, points), res) * res
            sql, params = series_sql(self.chunks, segments, col, flt, origin, step)
            rows = self._run(cur, sql, params, flt)
        return [SeriesPoint(int(t) / 1000.0, float(v)) for t, v in rows if v is not None]

    def _run(self, cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any], flt: Filter) -> list[Any]:
        if flt.entities is not None and len(flt.entities) > 2_000:
            cur.register(SELECTED, {"id": np.asarray(flt.entities, dtype=np.int32)})
        return cur.execute(sql, params).fetchall()

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        """Mean, min, max and count of ``metric`` per value of label ``by``; entities without
        that label are left out."""
        a, b = self._range(start, end)
        with self._reader() as cur:
            col = self._column(metric)
            if col is None:
                return []
            segments = plan(a, b, b - a, self._tiers())
            if not segments:
                return []
            flt = Filter()
            join = None
            if by not in ATTRIBUTION_LABELS:
                ids, values = self.entities.group_values(by)
                if len(ids) == 0:
                    return []
                join = "gpuscope_groups"
                cur.register(join, {"entity": ids, "g": np.array(values, dtype=object)})
            sql, params = aggregate_sql(self.chunks, segments, col, flt, by, join)
            rows = cur.execute(sql, params).fetchall()
        return [
            {"group": str(g), "mean": float(mean), "min": float(lo), "max": float(hi), "count": int(n)}
            for g, mean, lo, hi, n in rows
        ]

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        """Newest value of each metric per entity, from memory. ``max_age`` counts back from the
        newest sample in the store (not the wall clock, so simulated time works the same)."""
        self._check_open()
        self._flush()
        names = self.columns.names() if metrics is None else list(metrics)
        known = [(n, self.columns.get(n)) for n in names]
        pairs = [(n, c) for n, c in known if c is not None]
        if not pairs:
            return []
        ref = self.latest.max_ts
        min_ts = None if max_age is None or ref is None else ref - int(max_age * 1000)
        rows = self.latest.rows([c for _, c in pairs], min_ts)
        metric_names = [n for n, _ in pairs]
        gaps = cast(list[bool], np.isnan(rows.values).any(axis=1).tolist())
        attribution: dict[int, dict[str, str]] = {}
        out: list[dict[str, Any]] = []
        for eid, ts, code, vals, gap in zip(
            rows.entities.tolist(),
            rows.ts.tolist(),
            rows.attr.tolist(),
            rows.values.tolist(),
            gaps,
            strict=True,
        ):
            extra = attribution.get(code)
            if extra is None:
                pairs_ = zip(ATTR_COLUMNS, self.entities.attr_values(code), strict=True)
                extra = attribution[code] = {k: v for k, v in pairs_ if v is not None}
            labels = {**self.entities.labels(eid), **extra}
            # dict(zip()) runs in C; only rows with a missing metric need the NaN filter
            values = (
                {n: v for n, v in zip(metric_names, vals, strict=True) if v == v}
                if gap
                else dict(zip(metric_names, vals, strict=True))
            )
            out.append({"labels": labels, "ts": ts / 1000.0, "values": values})
        return out

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """Events in [start, end] (oldest first); the newest ``limit`` when there are more."""
        where = ["ts >= ?", "ts <= ?"]
        params: list[Any] = [start, end]
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        for key, value in (labels or {}).items():
            if not LABEL_KEY_RE.match(key):
                raise ValueError(f"label key {key!r} is not a valid label name")
            where.append(f"json_extract_string(labels, '$.{key}') = ?")
            params.append(value)
        params.append(int(limit))
        with self._reader() as cur:
            rows = cur.execute(
                f"SELECT ts, kind, labels, data FROM events WHERE {' AND '.join(where)} "
                "ORDER BY ts DESC LIMIT ?",
                params,
            ).fetchall()
        return [
            Event(float(ts), str(k), orjson.loads(lbl), orjson.loads(data)) for ts, k, lbl, data in rows[::-1]
        ]

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]:
        """A job's training records in [start, end] (oldest first); the newest ``limit`` when
        there are more."""
        where = "job = ? AND ts >= ? AND ts <= ?" + (" AND rank = ?" if rank is not None else "")
        params: list[Any] = [job, start, end, *([rank] if rank is not None else []), int(limit)]
        with self._reader() as cur:
            cols = self.train_columns.persisted()
            names = [self.train_columns.name(c) for c in cols]
            select = ", ".join(["ts", "job", "rank", "step", "labels", *(f"t{c}" for c in cols)])
            rows = cur.execute(
                f"SELECT {select} FROM training WHERE {where} ORDER BY ts DESC, rank DESC LIMIT ?", params
            ).fetchall()
        return [
            TrainingRecord(
                float(r[0]),
                str(r[1]),
                int(r[2]),
                int(r[3]),
                {n: float(v) for n, v in zip(names, r[5:], strict=True) if v is not None},
                orjson.loads(r[4]),
            )
            for r in rows[::-1]
        ]

    def save_alert(self, alert: Alert) -> None:
        self._check_open()
        doc = orjson.dumps(
            alert.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str
        ).decode()
        with self._alert_lock, self._reader(flush=False) as cur:
            cur.execute(
                "INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?)",
                [alert.id, alert.started_at, alert.resolved_at, doc],
            )

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        """Alerts newest first (by start time)."""
        where = "WHERE resolved_at IS NULL" if firing_only else ""
        with self._reader() as cur:
            rows = cur.execute(
                f"SELECT doc FROM alerts {where} ORDER BY started_at DESC, id LIMIT ?", [int(limit)]
            ).fetchall()
        return [Alert(**orjson.loads(r[0])) for r in rows]

    def stats(self) -> dict[str, Any]:
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
        with self._reader() as cur:
            counts = {t: _count(cur, t) for t in tables}
            size = cur.execute(
                "SELECT block_size, used_blocks FROM pragma_database_size() "
                "WHERE database_name = current_database()"
            ).fetchone()
        file_bytes = wal_bytes = 0
        if self.path != ":memory:":
            file_bytes = os.path.getsize(self.path)
            wal = self.path + ".wal"
            wal_bytes = os.path.getsize(wal) if os.path.exists(wal) else 0
        return {
            "path": self.path,
            "durable": self.durable,
            "rows": counts,
            "raw_rows": counts["samples"] + self.chunks.total_rows(),
            "chunk_files": len(self.chunks.all()),
            "chunk_bytes": self.chunks.total_bytes(),
            "entities": len(self.entities),
            "metrics": len(self.columns),
            "training_metrics": len(self.train_columns),
            "file_bytes": file_bytes,
            "disk_bytes": file_bytes + wal_bytes + self.chunks.total_bytes(),
            "wal_bytes": wal_bytes,
            "used_bytes": int(size[0]) * int(size[1]) if size else 0,
            "watermarks": {"rollup_1m": self._wm_1m, "rollup_1h": self._wm_1h, "raw_lo": self._raw_lo},
            "counters": {k: v for k, v in self.counters.snapshot().items() if k.startswith("store.")},
            "commits": self._writer.groups
            if self._writer is not None
            else self.counters.get("store.commits"),
        }

    def checkpoint(self) -> None:
        """Write everything to the database file and truncate the WAL."""
        self._flush()
        with self._reader() as cur:
            self._checkpoint(cur)

    def _checkpoint(self, con: duckdb.DuckDBPyConnection) -> None:
        # DuckDB refuses to checkpoint while another write transaction is open: pause the writer.
        with self._commit_lock, self._alert_lock:
            con.execute("CHECKPOINT")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def close(self) -> None:
        """Commit everything pending and close the file. Safe to call twice."""
        if self._closed:
            return
        if self._writer is not None:
            self._writer.close()
        self._flush()
        self._closed = True
        with self._maint_lock, self._commit_lock:
            self._wcon.close()
            self._mcon.close()
            self._con.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
