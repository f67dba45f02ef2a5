"""Periodic upkeep the hub runs every minute: sealing closed raw pieces (and merging the pieces of
each closed hour), rollups, retention.

All of it runs on its own cursor, concurrently with appends and queries. Three locks keep it
safe: the caller holds the DDL lock throughout (a new metric column must not be added to a table
this transaction writes: DuckDB would abort one of them); the commit lock is taken only to
checkpoint (DuckDB refuses to checkpoint while a write transaction is open) and to shed cached
blocks; the view lock makes committing a chunk change and publishing it to queries one step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from gpuscope.store.duckdb import maintenance as sql
from gpuscope.store.duckdb.chunks import Chunk, ChunkSet
from gpuscope.store.duckdb.schema import one
from gpuscope.store.duckdb.watermarks import HOUR_MS, MINUTE_MS, Watermarks, later

#: Retention checkpoints only once the WAL holds this much (by default). A checkpoint rewrites every row group
#: that changed since the last, whole: the hot table's last, partly filled one (up to 122,880 rows
#: of every metric) each time, which lifted a 64-node hub's RSS by 12-98 MiB every minute when
#: retention checkpointed after each run. The seal checkpoints after each of its deletes, when the
#: hot table holds one or two seal intervals; this is for stores that seal seldom or never.
COMPACT_CHECKPOINT_WAL_BYTES = 32 * 2**20
#: Cached table blocks are shed only when this much more than the cache bound is held: each shed
#: sets DuckDB's limit twice, which is cheap, but not worth it for a few blocks.
SHED_SLACK_BYTES = 4 * 2**20


@dataclass(frozen=True, slots=True)
class Retention:
    raw_ms: int
    minute_ms: int
    hour_ms: int
    records_s: float
    batch_ids: int
    batch_id_ttl_s: float


@dataclass(frozen=True, slots=True)
class CacheBound:
    """How much of DuckDB's buffer pool cached table blocks may keep between upkeeps
    (``storage.cache_limit``), and the pool's limit to restore after shedding the rest."""

    cache_bytes: int
    memory_limit: str


class Upkeep:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        chunks: ChunkSet,
        marks: Watermarks,
        columns: Callable[[], list[int]],
        checkpoint: Callable[[duckdb.DuckDBPyConnection], bool],
        wal_bytes: Callable[[], int],
        wal_checkpoint_bytes: int,
        commit_lock: threading.Lock,
        view_lock: threading.Lock,
        seal_interval_ms: int,
        lag_ms: int,
        retention: Retention,
        cache: CacheBound | None = None,
    ) -> None:
        self.con = con
        self.chunks = chunks
        self.marks = marks
        self.columns = columns
        self.checkpoint = checkpoint
        self.wal_bytes = wal_bytes
        self.wal_checkpoint_bytes = wal_checkpoint_bytes
        self.commit_lock = commit_lock
        self.view_lock = view_lock
        self.seal_interval_ms = seal_interval_ms
        self.lag_ms = lag_ms
        self.retention = retention
        self.cache = cache
        self.checkpoint_due = False  # a checkpoint DuckDB refused, to retry on the next call
        self.purge_due = False  # a seal or merge freed memory: compaction returns it (purge)

    def rollup(self, now_ms: int) -> dict[str, int]:
        con, marks = self.con, self.marks
        report = {"sealed_rows": 0, "merged_files": 0, "minute_ranges": 0, "hour_ranges": 0}
        cols = self.columns()
        cut = (now_ms - self.lag_ms - MINUTE_MS) // self.seal_interval_ms * self.seal_interval_ms
        if self.chunks.enabled and one(con, "SELECT 1 FROM samples WHERE ts < ? LIMIT 1", [cut]):
            report["sealed_rows"] = sum(c.rows for c in self.seal(cut, cols))
        if self.chunks.enabled:
            report["merged_files"] = self.merge(cut)
        self.purge_due = self.purge_due or bool(report["sealed_rows"] or report["merged_files"])
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

    def seal(self, cut: int, cols: list[int]) -> list[Chunk]:
        """Move hot rows older than ``cut`` into Parquet pieces, one per hour they fall in (a hot
        table that holds hours, after downtime, is sorted an hour at a time, and retention drops
        whole hours), then checkpoint.

        The checkpoint drops the sealed rows from the hot table's row groups (DuckDB vacuums
        deleted rows as it writes a row group). The table is not copied afresh as it once was: that
        copy held the live rows (1-2 minutes of every metric) twice, lifting a 64-node hub's RSS by
        up to ~20 MiB each minute, with the writer held out."""
        con = self.con
        row = one(con, "SELECT min(ts) FROM samples WHERE ts < ?", [cut])
        if row is None or row[0] is None:
            return []
        first_end = int(row[0]) // HOUR_MS * HOUR_MS + HOUR_MS
        bounds = [*range(first_end, cut, HOUR_MS), cut]
        pieces: list[Chunk] = []
        con.execute("BEGIN")
        try:
            for bound in bounds:
                chunk = self.chunks.seal(con, bound, cols)
                if chunk is not None:
                    pieces.append(chunk)
            with self.view_lock:  # queries see the rows either in the hot table or in the files
                con.execute("COMMIT")
                for chunk in pieces:
                    self.chunks.added(chunk)
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            self.chunks.discard(pieces)
            raise
        if not pieces:
            return []
        self.checkpoint_due = not self.checkpoint(con)
        return pieces

    def merge(self, cut: int) -> int:
        """Merge the pieces of each closed hour (its end is below the seal's ``cut``) into one
        file; the number of files merged.

        Late rows for an hour already merged are sealed as pieces of it again; rewriting the hour
        for each would cost a hub that is catching up an hour's rewrite a minute, so they are
        merged in once an hour holds as many files as an hour has seal intervals.
        """
        per_hour = max(HOUR_MS // self.seal_interval_ms, 1)
        hours: dict[int, list[Chunk]] = {}
        for chunk in self.chunks.all():
            hours.setdefault(chunk.lo // HOUR_MS * HOUR_MS, []).append(chunk)
        merged = 0
        for hour, files in hours.items():
            if hour + HOUR_MS > cut or len(files) < 2:
                continue
            if any(c.merged for c in files) and len(files) <= per_hour:
                continue
            con = self.con
            con.execute("BEGIN")
            try:
                chunk = self.chunks.merge(con, files)
                with self.view_lock:  # queries read either the pieces or the merged file
                    con.execute("COMMIT")
                    self.chunks.replaced(files, chunk)
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            merged += len(files)
        return merged

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
        if self.checkpoint_due or self.wal_bytes() >= self.wal_checkpoint_bytes:
            self.checkpoint_due = not self.checkpoint(con)
        report["cache_shed_bytes"], purged = self.shed_cache()
        freed = bool(expired) or any(report[table] for table in deletes)
        if (self.purge_due or freed) and not purged:
            purged = self.purge()
        self.purge_due = False
        report["allocator_purged"] = int(purged)
        return report

    def purge(self) -> bool:
        """Return the pages DuckDB's allocator holds freed to the OS; whether it was asked to.

        DuckDB's jemalloc keeps what a seal, merge or retention freed as dirty pages; its
        background threads return them as they decay (about a second, more when starved), and
        right after a 64-GPU seal RSS stood 20-70 MiB above its level. Setting ``memory_limit``
        (to the same value: nothing is evicted) makes DuckDB flush this thread's cache and purge
        every arena, and trim glibc's heap (duckdb/duckdb ``BufferPool::SetLimit`` in
        src/storage/buffer/buffer_pool.cpp calls ``BlockAllocator::FlushAll`` ->
        ``Allocator::FlushAll`` in src/common/allocator/allocator_jemalloc.cpp: v1.5.5,
        d8cdaa33fda8df955cc76ef58a280f68f4cd43fa, and the same at 044a04a7cd39, 2026-08; measured
        on the installed 2.0.1 in tests/store/test_allocator.py). Once an upkeep, at its end; a
        store without a configured limit (in memory) is left to the background threads.
        """
        if self.cache is None:
            return False
        try:
            self.con.execute(f"SET memory_limit = '{self.cache.memory_limit}'")
        except duckdb.Error:
            return False  # the pool holds more than its limit (pinned): the next upkeep tries again
        return True

    def shed_cache(self) -> tuple[int, bool]:
        """Evict cached table blocks beyond the cache bound: the bytes DuckDB's pool gave up, and
        whether the limit was set (which purged the allocator too, see :meth:`purge`).

        DuckDB has no call to drop its cache, and it evicts only to stay under ``memory_limit``:
        so the limit is lowered to what the pool holds less the excess and set back at once. Only
        BASE_TABLE's excess is asked for: those blocks are on disk and are dropped (measured: the
        pool gave them up, not the hot table's unwritten rows, which it would spill to its temp
        directory). The writer is held out meanwhile; a query that needs memory in between
        evicts from the ``cache_bytes`` of blocks left rather than failing."""
        if self.cache is None:
            return 0, False
        con = self.con
        held = dict(con.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall())
        excess = int(held.get("BASE_TABLE", 0)) - self.cache.cache_bytes
        if excess < SHED_SLACK_BYTES:
            return 0, False
        total = sum(int(v) for v in held.values())
        with self.commit_lock:
            try:
                con.execute(f"SET memory_limit = '{total - excess}B'")
            except duckdb.Error:
                pass  # could not evict that far (pinned): what it did evict is still shed
            finally:
                con.execute(f"SET memory_limit = '{self.cache.memory_limit}'")
        after = one(con, "SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
        return (max(0, total - int(after[0])) if after and after[0] is not None else 0), True
