"""The query side of the store: series, aggregates, snapshots, events, training records, alerts.

Every SQL query runs in a transaction whose snapshot is taken together with the list of chunk
files and the watermarks (under the view lock), so a query never sees rows twice or not at all
while upkeep moves them from the hot table into a file or from raw rows into rollups.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import duckdb
import numpy as np
import orjson

from gpuscope.model import ATTRIBUTION_LABELS, Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store.base import SeriesPoint
from gpuscope.store.duckdb.chunks import ChunkSet, ChunkView
from gpuscope.store.duckdb.latest import LatestCache
from gpuscope.store.duckdb.planner import Tier, plan
from gpuscope.store.duckdb.queries import Filter, aggregate_sql, series_sql
from gpuscope.store.duckdb.watermarks import Watermarks
from gpuscope.store.errors import StoreError
from gpuscope.store.event_filter import event_filter
from gpuscope.store.registry import ATTR_COLUMNS, ColumnRegistry, EntityRegistry
from gpuscope.store.replay import REPLAY_LIMIT, Row, Scope, batches, ceil_div, ms_range

GROUPS = "gpuscope_groups"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent moment: an open cursor plus the chunk files and tiers matching its data."""

    cur: duckdb.DuckDBPyConnection
    chunks: ChunkView
    tiers: list[Tier]


class Reader:
    def __init__(
        self,
        cursor: Callable[[], duckdb.DuckDBPyConnection],
        entities: EntityRegistry,
        columns: ColumnRegistry,
        train_columns: ColumnRegistry,
        latest: LatestCache,
        chunks: ChunkSet,
        marks: Watermarks,
        view_lock: threading.Lock,
    ) -> None:
        self.cursor = cursor
        self.entities = entities
        self.columns = columns
        self.train_columns = train_columns
        self.latest = latest
        self.chunks = chunks
        self.marks = marks
        self.view_lock = view_lock

    @contextlib.contextmanager
    def snapshot_of_now(self) -> Iterator[Snapshot]:
        cur = self.cursor()
        try:
            with self.view_lock:
                cur.execute("BEGIN")
                cur.execute("SELECT 1 FROM meta LIMIT 0").fetchall()  # fixes the transaction's snapshot
                snap = Snapshot(cur, self.chunks.view(), self.marks.tiers())
            yield snap
            cur.execute("COMMIT")
        except duckdb.Error as exc:
            raise StoreError(f"query failed: {exc}") from None
        finally:
            cur.close()

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
        return None if col is None or self.columns.still_pending((col,)) else col

    def series(self, metric: str, labels: Labels, start: float, end: float, points: int) -> list[SeriesPoint]:
        if points < 1:
            raise ValueError(f"points must be at least 1, got {points}")
        a, b = ms_range(start, end)
        col, flt = self._column(metric), self._filter(labels)
        if col is None or flt is None:
            return []
        with self.snapshot_of_now() as snap:
            step = max(1, ceil_div(b - a, points))
            segments = plan(a, b, step, snap.tiers)
            if not segments:
                return []
            origin = a
            res = max((tier.res for tier, _, _ in segments if tier.res <= step), default=0)
            if res:  # whole rollup buckets per point: align the grid and the step to the bucket width
                origin = a // res * res
                step = ceil_div(ceil_div(b - origin, points), res) * res
            sql, params = series_sql(snap.chunks, segments, col, flt, origin, step)
            # Arrays reach DuckDB through its replacement scan (found by their local names), not
            # register(): that writes the catalog and makes the query a write transaction, and
            # DuckDB refuses to checkpoint while one is open.
            gpuscope_selected = {"id": np.asarray(flt.entities or [], dtype=np.int32)}  # noqa: F841
            rows = snap.cur.execute(sql, params).fetchall()
        return [SeriesPoint(int(t) / 1000.0, float(v)) for t, v in rows if v is not None]

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        a, b = ms_range(start, end)
        col = self._column(metric)
        if col is None:
            return []
        join = None
        if by not in ATTRIBUTION_LABELS:
            ids, values = self.entities.group_values(by)
            if len(ids) == 0:
                return []
            join = GROUPS
        with self.snapshot_of_now() as snap:
            segments = plan(a, b, b - a, snap.tiers)
            if not segments:
                return []
            if join is not None:  # read by name by DuckDB's replacement scan (see series)
                gpuscope_groups = {"entity": ids, "g": np.array(values, dtype=object)}  # noqa: F841
            sql, params = aggregate_sql(snap.chunks, segments, col, Filter(), by, join)
            rows = snap.cur.execute(sql, params).fetchall()
        return [
            {"group": str(g), "mean": float(mean), "min": float(lo), "max": float(hi), "count": int(n)}
            for g, mean, lo, hi, n in rows
        ]

    def snapshot(self, metrics: list[str] | None, max_age: float | None) -> list[dict[str, Any]]:
        names = self.columns.names() if metrics is None else list(metrics)
        pairs = [(n, c) for n, c in ((n, self.columns.get(n)) for n in names) if c is not None]
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
                values_of = zip(ATTR_COLUMNS, self.entities.attr_values(code), strict=True)
                extra = attribution[code] = {k: v for k, v in values_of if v is not None}
            # dict(zip()) runs in C; only rows with a missing metric need the NaN filter
            values = (
                {n: v for n, v in zip(metric_names, vals, strict=True) if v == v}
                if gap
                else dict(zip(metric_names, vals, strict=True))
            )
            out.append(
                {"labels": {**self.entities.labels(eid), **extra}, "ts": ts / 1000.0, "values": values}
            )
        return out

    def events(
        self, start: float, end: float, kind: str | None, labels: Labels | None, limit: int
    ) -> list[Event]:
        where, params = event_filter(
            start, end, kind, labels, lambda k, v: (f"json_extract_string(labels, '$.{k}') = ?", v), "?"
        )
        with self.snapshot_of_now() as snap:
            rows = snap.cur.execute(
                f"SELECT ts, kind, labels, data FROM events WHERE {where} ORDER BY ts DESC LIMIT ?",
                [*params, int(limit)],
            ).fetchall()
        return [
            Event(float(ts), str(k), orjson.loads(lbl), orjson.loads(data)) for ts, k, lbl, data in rows[::-1]
        ]

    def training(
        self, job: str, start: float, end: float, rank: int | None, limit: int
    ) -> list[TrainingRecord]:
        where = "job = ? AND ts >= ? AND ts <= ?" + (" AND rank = ?" if rank is not None else "")
        params: list[Any] = [job, start, end, *([rank] if rank is not None else [])]
        return self._training(where, params, limit)

    def _training(self, where: str, params: list[Any], limit: int) -> list[TrainingRecord]:
        """The newest ``limit`` training records matching ``where``, oldest first."""
        params = [*params, int(limit)]
        cols = self.train_columns.persisted()
        names = [self.train_columns.name(c) for c in cols]
        select = ", ".join(["ts", "job", "rank", "step", "labels", *(f"t{c}" for c in cols)])
        with self.snapshot_of_now() as snap:
            rows = snap.cur.execute(
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

    def alerts(self, firing_only: bool, limit: int) -> list[Alert]:
        where = "WHERE resolved_at IS NULL" if firing_only else ""
        with self.snapshot_of_now() as snap:
            rows = snap.cur.execute(
                f"SELECT doc FROM alerts {where} ORDER BY started_at DESC, id LIMIT ?", [int(limit)]
            ).fetchall()
        return [Alert(**orjson.loads(r[0])) for r in rows]

    def replay(self, start: float, end: float, scope: Scope) -> Iterator[Batch]:
        """What was stored in [start, end] (raw telemetry: hot table and chunk files), as batches."""
        a, b = ms_range(start, end)
        cols = self.columns.persisted()
        names = [self.columns.name(c) for c in cols]
        where, params = "ts >= ? AND ts < ?", list[Any]([a, b])
        if not scope.everything:
            ids = sorted({e for node in scope.nodes or () for e in self.entities.match({"node": node})})
            jobs = sorted(scope.jobs or ())
            keys = [f"entity IN ({', '.join(map(str, ids))})"] if ids else []
            keys += [f"job IN ({', '.join('?' * len(jobs))})"] if jobs else []
            where += f" AND ({' OR '.join(keys) or 'FALSE'})"
            params += jobs
        with self.snapshot_of_now() as snap:
            src, src_params = snap.chunks.source(
                ["ts", "entity", *ATTR_COLUMNS, *(f"m{c}" for c in cols)], where, params, a, b
            )
            telemetry = snap.cur.execute(f"SELECT * FROM ({src}) ORDER BY ts, entity", src_params).fetchall()
            stored = snap.cur.execute(
                "SELECT ts, kind, labels, data FROM events WHERE ts >= ? AND ts <= ? ORDER BY ts",
                [start, end],
            ).fetchall()
        rows: list[Row] = []
        first = 2 + len(ATTR_COLUMNS)
        for r in telemetry:
            labels = {**self.entities.labels(int(r[1]))}
            labels.update((k, v) for k, v in zip(ATTR_COLUMNS, r[2:first], strict=True) if v is not None)
            values = {n: float(v) for n, v in zip(names, r[first:], strict=True) if v is not None}
            rows.append((int(r[0]) / 1000.0, labels, values))
        events = [Event(float(ts), str(k), orjson.loads(lbl), orjson.loads(d)) for ts, k, lbl, d in stored]
        return batches(rows, events, self.replay_training(start, end, scope), scope)

    def replay_training(self, start: float, end: float, scope: Scope) -> list[TrainingRecord]:
        """Training records of [start, end] of the jobs in ``scope`` (all jobs for everything)."""
        where, params = "ts >= ? AND ts <= ?", list[Any]([start, end])
        if not scope.everything:
            jobs = sorted(scope.jobs or ())
            if not jobs:
                return []
            where += f" AND job IN ({', '.join('?' * len(jobs))})"
            params += jobs
        return self._training(where, params, REPLAY_LIMIT)
