"""SQL for series and aggregates over the tier segments chosen by the planner.

Every segment yields the same columns - time ``t``, mean ``v``, sample count ``n``, ``lo``/``hi``
and the grouping keys - so raw rows (n = 1) and rollup rows (n = samples in the bucket) combine
into correctly weighted means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.store.duckdb.chunks import ChunkView
from gpuscope.store.duckdb.planner import Tier

INLINE_IDS = 2_000
SELECTED = "gpuscope_selected"


@dataclass(slots=True)
class Filter:
    """Rows to read: entity ids (None = all) and per-row attribution label values."""

    entities: list[int] | None = None
    attribution: dict[str, str] = field(default_factory=dict)

    def sql(self) -> str:
        parts: list[str] = []
        if self.entities is not None:
            if len(self.entities) <= INLINE_IDS:
                parts.append(f"entity IN ({', '.join(str(int(e)) for e in self.entities)})")
            else:
                parts.append(f"entity IN (SELECT id FROM {SELECTED})")
        for key in sorted(self.attribution):
            parts.append(f"{key} = ?")
        return " AND ".join(parts)

    def values(self) -> list[Any]:
        return [self.attribution[k] for k in sorted(self.attribution)]


def _segment(
    raw: ChunkView, tier: Tier, col: int, a: int, b: int, flt: Filter, keys: list[str]
) -> tuple[str, list[Any]]:
    extra = flt.sql()
    cond = f" AND {extra}" if extra else ""
    tail = "".join(f", {k}" for k in keys)
    if tier.res == 0:
        where = f"ts >= ? AND ts < ? AND m{col} IS NOT NULL{cond}"
        src, params = raw.source(["ts", f"m{col}", *keys], where, [a, b, *flt.values()], a, b, require=col)
        select = f"ts AS t, m{col}::DOUBLE AS v, 1 AS n, m{col} AS lo, m{col} AS hi{tail}"
        return f"(SELECT {select} FROM ({src}))", params
    table = f"rollup_{tier.name}"
    select = f"bucket AS t, a{col}::DOUBLE AS v, n{col} AS n, lo{col} AS lo, hi{col} AS hi{tail}"
    where = f"bucket >= ? AND bucket < ? AND n{col} > 0{cond}"
    return f"(SELECT {select} FROM {table} WHERE {where})", [a, b, *flt.values()]


def source(
    raw: ChunkView, segments: list[tuple[Tier, int, int]], col: int, flt: Filter, keys: list[str]
) -> tuple[str, list[Any]]:
    parts: list[str] = []
    params: list[Any] = []
    for tier, a, b in segments:
        sql, p = _segment(raw, tier, col, a, b, flt, keys)
        parts.append(sql)
        params.extend(p)
    return " UNION ALL ".join(parts), params


def series_sql(
    raw: ChunkView, segments: list[tuple[Tier, int, int]], col: int, flt: Filter, start: int, step: int
) -> tuple[str, list[Any]]:
    src, params = source(raw, segments, col, flt, [])
    sql = (
        f"SELECT min(t) AS t, sum(v * n) / sum(n) AS v FROM ({src}) "
        f"GROUP BY (t - {int(start)}) // {int(step)} ORDER BY 1"
    )
    return sql, params


def aggregate_sql(
    raw: ChunkView,
    segments: list[tuple[Tier, int, int]],
    col: int,
    flt: Filter,
    group: str,
    join_table: str | None,
) -> tuple[str, list[Any]]:
    src, params = source(raw, segments, col, flt, [group if join_table is None else "entity"])
    if join_table is None:
        body = f"SELECT {group} AS g, v, n, lo, hi FROM ({src})"
    else:
        body = f"SELECT j.g AS g, v, n, lo, hi FROM ({src}) s JOIN {join_table} j ON s.entity = j.entity"
    sql = (
        f"SELECT g, sum(v * n) / sum(n), min(lo), max(hi), sum(n) FROM ({body}) "
        f"WHERE g IS NOT NULL GROUP BY g ORDER BY g"
    )
    return sql, params
