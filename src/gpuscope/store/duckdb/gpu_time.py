"""The productivity model's rollups of GPU time in the DuckDB store (also the remote backend's
local meta store): minute cells per GPU, folded into hour cells once old."""

from __future__ import annotations

import math

import duckdb

from gpuscope.store.base import GpuTime

KEY = ("res", "bucket", "node", "gpu", "job", "team", "service", "cause")
#: created on open when missing: stores written before it existed gain it without a migration
DDL = (
    "CREATE TABLE IF NOT EXISTS gpu_time (res INTEGER NOT NULL, bucket DOUBLE NOT NULL, "
    "node VARCHAR NOT NULL, gpu VARCHAR NOT NULL, job VARCHAR NOT NULL, team VARCHAR NOT NULL, "
    "service VARCHAR NOT NULL, cause VARCHAR NOT NULL, seconds DOUBLE NOT NULL, lost DOUBLE NOT NULL, "
    f"PRIMARY KEY ({', '.join(KEY)}))"
)
_COLUMNS = ", ".join((*KEY, "seconds", "lost"))
#: the minute cells a fold takes: ``bucket`` compared as stored, so zone maps can skip row groups
FOLD_WINDOW = "res = 60 AND bucket <= ? AND bucket >= ?"


def save(con: duckdb.DuckDBPyConnection, cells: list[GpuTime]) -> None:
    """One statement for all cells (column lists zipped by ``unnest``): ``executemany`` costs a
    transaction per row, about 10 ms each on a file."""
    if not cells:
        return
    con.execute(
        f"INSERT OR REPLACE INTO gpu_time ({_COLUMNS}) SELECT unnest(?::INTEGER[]), unnest(?::DOUBLE[]), "
        "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
        "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::DOUBLE[]), unnest(?::DOUBLE[])",
        [
            [c.res for c in cells],
            [c.bucket for c in cells],
            [c.node for c in cells],
            [c.gpu for c in cells],
            [c.job for c in cells],
            [c.team for c in cells],
            [c.service for c in cells],
            [c.cause for c in cells],
            [c.seconds for c in cells],
            [c.lost for c in cells],
        ],
    )


def fold(con: duckdb.DuckDBPyConnection, before: float, since: float = -math.inf) -> int:
    """Minute cells ending by ``before`` (and starting at ``since`` or later) added into their hour
    cells and deleted, in one transaction.

    The predicates compare ``bucket`` itself, so DuckDB's zone maps skip the row groups outside
    ``[since, before)``: with ``since`` a fold reads the rows of its window, not every hour cell
    the table keeps (90 days of them by default)."""
    where = FOLD_WINDOW
    params = [before - 60.0, since]
    con.execute("BEGIN")
    try:
        con.execute(
            f"INSERT INTO gpu_time ({_COLUMNS}) "
            "SELECT 3600, floor(bucket / 3600) * 3600 AS hour, node, '', job, team, service, cause, "
            f"sum(seconds), sum(lost) FROM gpu_time WHERE {where} "
            "GROUP BY hour, node, job, team, service, cause "
            "ON CONFLICT DO UPDATE SET seconds = seconds + excluded.seconds, lost = lost + excluded.lost",
            params,
        )
        rows = con.execute(f"DELETE FROM gpu_time WHERE {where}", params).fetchall()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return int(rows[0][0]) if rows else 0


def read(con: duckdb.DuckDBPyConnection, start: float, end: float) -> list[GpuTime]:
    rows = con.execute(
        f"SELECT {_COLUMNS} FROM gpu_time WHERE bucket < ? AND bucket + res > ? ORDER BY res, bucket",
        [end, start],
    ).fetchall()
    return [
        GpuTime(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], float(r[8]), float(r[9]))
        for r in rows
    ]
