"""SQL of the periodic jobs: sealing raw chunks, rollups, retention.

Sealing exists for compression: rows arrive in time order (all GPUs of one tick together), but
DuckDB compresses vectors of 1,024 consecutive values of a column, and a GPU's own values vary far
less than a tick's values across GPUs. Rewriting each closed chunk ordered by (entity, ts) makes
ALP/RLE/bitpacking see one GPU at a time, and lets zone maps skip other GPUs in series queries.
"""

from __future__ import annotations

import duckdb

from gpuscope.store._registry import ATTR_COLUMNS
from gpuscope.store._schema import ROLLUP_PARTS

MINUTE_MS = 60_000
HOUR_MS = 3_600_000

_KEYS = ", ".join(("entity", *ATTR_COLUMNS))


def raw_union(select: str, where: str) -> str:
    """The same SELECT over the sealed and the recent raw table (filters pushed into both)."""
    return (
        f"SELECT {select} FROM samples WHERE {where} "
        f"UNION ALL SELECT {select} FROM samples_recent WHERE {where}"
    )


def seal(con: duckdb.DuckDBPyConnection, cut: int, cols: list[int]) -> int:
    """Move recent rows older than ``cut`` (ms) into the sealed table, sorted by entity and time."""
    names = ", ".join(["ts", "entity", *ATTR_COLUMNS, *(f"m{c}" for c in cols)])
    row = con.execute("SELECT count(*) FROM samples_recent WHERE ts < ?", [cut]).fetchone()
    moved = int(row[0]) if row else 0
    if moved:
        con.execute(
            f"INSERT INTO samples ({names}) "
            f"SELECT {names} FROM samples_recent WHERE ts < ? ORDER BY entity, ts",
            [cut],
        )
        con.execute("DELETE FROM samples_recent WHERE ts < ?", [cut])
    return moved


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def rollup_minutes(con: duckdb.DuckDBPyConnection, a: int, b: int, cols: list[int]) -> None:
    """Recompute the 1-minute rollup of buckets in [a, b) from raw rows (idempotent)."""
    con.execute("DELETE FROM rollup_1m WHERE bucket >= ? AND bucket < ?", [a, b])
    if not cols:
        return
    targets = ", ".join(f"{p}{c}" for c in cols for p in ROLLUP_PARTS)
    aggs = ", ".join(f"count(m{c}), avg(m{c}), min(m{c}), max(m{c})" for c in cols)
    names = ", ".join(["ts", "entity", *ATTR_COLUMNS, *(f"m{c}" for c in cols)])
    src = raw_union(names, "ts >= $a AND ts < $b")
    con.execute(
        f"INSERT INTO rollup_1m (bucket, {_KEYS}, {targets}) "
        f"SELECT ts // {MINUTE_MS} * {MINUTE_MS} AS bucket, {_KEYS}, {aggs} FROM ({src}) GROUP BY ALL",
        {"a": a, "b": b},
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
