"""Periodic upkeep the hub runs every minute: sealing closed raw chunks, rollups, retention.

All of it runs on its own cursor, concurrently with appends and queries. Three locks keep it
safe: the caller holds the DDL lock throughout (a new metric column must not be added to a table
this transaction writes: DuckDB would abort one of them); the commit lock is taken only to swap
the hot table and to checkpoint (DuckDB refuses to checkpoint while a write transaction is open);
the view lock makes committing a chunk change and publishing it to queries one step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import duckdb

from gpuscope.store.duckdb import maintenance as sql
from gpuscope.store.duckdb.chunks import Chunk, ChunkSet
from gpuscope.store.duckdb.schema import hot_table_swap, one
from gpuscope.store.duckdb.watermarks import HOUR_MS, MINUTE_MS, Watermarks, later


@dataclass(frozen=True, slots=True)
class Retention:
    raw_ms: int
    minute_ms: int
    hour_ms: int
    records_s: float
    batch_ids: int
    batch_id_ttl_s: float


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN")
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


class Upkeep:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        chunks: ChunkSet,
        marks: Watermarks,
        columns: Callable[[], list[int]],
        checkpoint: Callable[[duckdb.DuckDBPyConnection], bool],
        commit_lock: threading.Lock,
        view_lock: threading.Lock,
        seal_chunk_ms: int,
        lag_ms: int,
        retention: Retention,
    ) -> None:
        self.con = con
        self.chunks = chunks
        self.marks = marks
        self.columns = columns
        self.checkpoint = checkpoint
        self.commit_lock = commit_lock
        self.view_lock = view_lock
        self.seal_chunk_ms = seal_chunk_ms
        self.lag_ms = lag_ms
        self.retention = retention
        self.checkpoint_due = False  # a checkpoint DuckDB refused, to retry on the next call

    def rollup(self, now_ms: int) -> dict[str, int]:
        con, marks = self.con, self.marks
        report = {"sealed_rows": 0, "minute_ranges": 0, "hour_ranges": 0}
        cols = self.columns()
        cut = (now_ms - self.lag_ms - MINUTE_MS) // self.seal_chunk_ms * self.seal_chunk_ms
        if self.chunks.enabled and one(con, "SELECT 1 FROM samples WHERE ts < ? LIMIT 1", [cut]):
            chunk = self.seal(cut, cols)
            report["sealed_rows"] = chunk.rows if chunk else 0
        closed = (now_ms - self.lag_ms) // MINUTE_MS * MINUTE_MS
        try:
            with marks.lock:  # from here on, the writer marks rows below `closed` as late
                start = marks.wm_1m if marks.wm_1m is not None else self._oldest()
                if start is None:
                    return report
                marks.pending = later(marks.wm_1m, closed)
                con.execute("BEGIN")  # the snapshot starts now: rows committed later are marked late
                dirty = [
                    int(r[0]) for r in con.execute("SELECT DISTINCT bucket FROM rollup_dirty").fetchall()
                ]
            ranges = [(b, b + MINUTE_MS) for b in dirty if b < closed]
            if closed > start:
                ranges.append((start, closed))
            ranges = sql.merge_ranges(ranges)
            for a, b in ranges:
                sql.rollup_minutes(con, self.chunks.view(), a, b, cols)
            closed_hour = closed // HOUR_MS * HOUR_MS
            hours = sql.hours_of(ranges, closed_hour)
            if marks.wm_1h is not None and closed_hour > marks.wm_1h:
                hours = sql.merge_ranges([*hours, (marks.wm_1h, closed_hour)])
            for a, b in hours:
                sql.rollup_hours(con, a, b, cols)
            if dirty:
                con.execute("DELETE FROM rollup_dirty WHERE bucket < ?", [closed])
            new = {"wm_1m": later(marks.wm_1m, closed), "wm_1h": later(marks.wm_1h, closed_hour)}
            marks.save(con, **new)
            con.execute("COMMIT")
        except BaseException:
            with marks.lock:
                marks.pending = marks.wm_1m
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        with self.view_lock:
            marks.apply(**new)
        if self.checkpoint_due:
            self.checkpoint_due = not self.checkpoint(con)
        report["minute_ranges"], report["hour_ranges"] = len(ranges), len(hours)
        return report

    def _oldest(self) -> int | None:
        """Start of the first minute holding raw data (where a first rollup begins)."""
        row = one(self.con, "SELECT min(ts) FROM samples")
        oldest = [c.lo for c in self.chunks.all()] + ([int(row[0])] if row and row[0] is not None else [])
        return min(oldest) // MINUTE_MS * MINUTE_MS if oldest else None

    def seal(self, cut: int, cols: list[int]) -> Chunk | None:
        """Move hot rows older than ``cut`` into a Parquet chunk, then give the hot table a fresh
        start (see :func:`hot_table_swap`) and checkpoint."""
        con = self.con
        con.execute("BEGIN")
        try:
            chunk = self.chunks.seal(con, cut, cols)
            with self.view_lock:  # queries see the rows either in the hot table or in the file
                con.execute("COMMIT")
                if chunk is not None:
                    self.chunks.added(chunk)
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        if chunk is None:
            return None
        with self.commit_lock, _transaction(con):  # the writer appends to `samples`: keep it out
            for stmt in hot_table_swap(cols):
                con.execute(stmt)
        self.checkpoint_due = not self.checkpoint(con)
        return chunk

    def compact(self, now_ms: int) -> dict[str, int]:
        con, marks, keep = self.con, self.marks, self.retention
        raw_cut = min(now_ms - keep.raw_ms, marks.wm_1m if marks.wm_1m is not None else 0)
        m_cut = min(now_ms - keep.minute_ms, marks.wm_1h if marks.wm_1h is not None else 0)
        h_cut = now_ms - keep.hour_ms
        record_cut = now_ms / 1000 - keep.records_s
        report: dict[str, int] = {}
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
                "gpu_time": ("DELETE FROM gpu_time WHERE bucket < ?", record_cut),
                "alerts": ("DELETE FROM alerts WHERE resolved_at < ?", h_cut / 1000),
            }
            for table, (stmt, arg) in deletes.items():
                row = one(con, stmt, [arg])
                report[table] = int(row[0]) if row else 0
            row = one(
                con,
                "DELETE FROM batch_ids WHERE received < ? OR seq <= (SELECT max(seq) FROM batch_ids) - ?",
                [time.time() - keep.batch_id_ttl_s, keep.batch_ids],
            )
            report["batch_ids"] = int(row[0]) if row else 0
            new = {
                "raw_lo": later(marks.raw_lo, raw_cut),
                "m_lo": later(marks.m_lo, m_cut),
                "h_lo": later(marks.h_lo, h_cut),
            }
            marks.save(con, **new)
            with self.view_lock:
                con.execute("COMMIT")
                marks.apply(**new)
                self.chunks.removed(expired)
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        self.checkpoint_due = not self.checkpoint(con)
        return report
