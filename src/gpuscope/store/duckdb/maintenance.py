"""SQL of the periodic rollup jobs: per-minute and per-hour mean, min, max and count.

Rollups are recomputed whole buckets at a time from their source (raw rows for minutes, minutes
for hours), so recomputing a bucket after late rows arrive gives the same answer as if the rows
had been on time.
"""

from __future__ import annotations

import duckdb

from gpuscope.store.duckdb.chunks import BASE_COLUMNS, ChunkView
from gpuscope.store.duckdb.schema import ROLLUP_PARTS
from gpuscope.store.duckdb.watermarks import HOUR_MS, MINUTE_MS
from gpuscope.store.registry import ATTR_COLUMNS

_KEYS = ", ".join(("entity", *ATTR_COLUMNS))


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def rollup_minutes(con: duckdb.DuckDBPyConnection, raw: ChunkView, a: int, b: int, cols: list[int]) -> None:
    """Recompute the 1-minute rollup of buckets in [a, b) from raw rows (idempotent)."""
    con.execute("DELETE FROM rollup_1m WHERE bucket >= ? AND bucket < ?", [a, b])
    if not cols:
        return
    targets = ", ".join(f"{p}{c}" for c in cols for p in ROLLUP_PARTS)
    aggs = ", ".join(f"count(m{c}), avg(m{c}), min(m{c}), max(m{c})" for c in cols)
    src, params = raw.source([*BASE_COLUMNS, *(f"m{c}" for c in cols)], "ts >= ? AND ts < ?", [a, b], a, b)
    con.execute(
        f"INSERT INTO rollup_1m (bucket, {_KEYS}, {targets}) "
        f"SELECT ts // {MINUTE_MS} * {MINUTE_MS} AS bucket, {_KEYS}, {aggs} FROM ({src}) GROUP BY ALL "
        "ORDER BY entity, bucket",
        params,
    )


def rollup_hours(con: duckdb.DuckDBPyConnection, a: int, b: int, cols: list[int]) -> None:
    """Recompute the 1-hour rollup of buckets in [a, b) from the 1-minute rollup."""
    con.execute("DELETE FROM rollup_1h WHERE bucket >= ? AND bucket < ?", [a, b])
    if not cols:
        return
    targets = ", ".join(f"{p}{c}" for c in cols for p in ROLLUP_PARTS)
    aggs = ", ".join(
        f"sum(n{c}), sum(a{c} * n{c}) / nullif(sum(n{c}), 0), min(lo{c}), max(hi{c})" for c in cols
    )
    con.execute(
        f"INSERT INTO rollup_1h (bucket, {_KEYS}, {targets}) "
        f"SELECT bucket // {HOUR_MS} * {HOUR_MS} AS hb, {_KEYS}, {aggs} FROM rollup_1m "
        f"WHERE bucket >= ? AND bucket < ? GROUP BY ALL",
        [a, b],
    )


def hours_of(ranges: list[tuple[int, int]], closed_hour: int) -> list[tuple[int, int]]:
    """Whole hours touched by minute ranges, limited to hours that have closed."""
    hours = [(a // HOUR_MS * HOUR_MS, min(-(-b // HOUR_MS) * HOUR_MS, closed_hour)) for a, b in ranges]
    return merge_ranges(hours)
