"""Bulk inserts of prepared column arrays through DuckDB's replacement scan of numpy dicts.

One INSERT of telemetry rows per transaction (their column sets united): the statement overhead
(several ms on a wide table) is paid once for thousands of rows, and DuckDB reads the arrays
without a Python loop per value.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import orjson

from gpuscope.model import Labels
from gpuscope.store.prepare import RowBlock, TrainingRow
from gpuscope.store.registry import ATTR_COLUMNS


def _insert(
    con: duckdb.DuckDBPyConnection, table: str, data: dict[str, Any], exprs: dict[str, str] | None = None
) -> None:
    """INSERT INTO table (columns of data) SELECT them from the arrays."""
    names = [n for n in data if not n.startswith("_")]
    select = ", ".join((exprs or {}).get(n, n) for n in names)
    # DuckDB's replacement scan finds this local by name; it costs half of register()+unregister().
    gpuscope_rows = data  # noqa: F841
    con.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {select} FROM gpuscope_rows")


def concat(
    block: RowBlock,
) -> tuple[
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.float32]],
]:
    if len(block.ts) == 1:
        return block.ts[0], block.entity[0], block.attr[0], block.values[0]
    return (
        np.concatenate(block.ts),
        np.concatenate(block.entity),
        np.concatenate(block.attr),
        np.concatenate(block.values),
    )


Rows = tuple[
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.int32]],
    np.ndarray[Any, np.dtype[np.float32]],
]


def union(arrays: dict[tuple[int, ...], Rows]) -> tuple[tuple[int, ...], Rows]:
    """Rows of several column sets as one block over all their columns (NaN, stored as NULL, where
    a row's set lacks a column): one INSERT per tick instead of one per column set, whose
    statement cost (a few ms each, on a table of many columns) dominated the tick's commit."""
    if len(arrays) == 1:
        [(cols, rows)] = arrays.items()
        return cols, rows
    cols = tuple(sorted(set().union(*arrays)))
    where = {c: j for j, c in enumerate(cols)}
    n = sum(len(rows[0]) for rows in arrays.values())
    values = np.full((n, len(cols)), np.nan, dtype=np.float32)
    start = 0
    for key, (ts, _, _, block) in arrays.items():
        values[start : start + len(ts), [where[c] for c in key]] = block
        start += len(ts)
    parts = list(arrays.values())
    return cols, (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        values,
    )


def insert_rows(
    con: duckdb.DuckDBPyConnection,
    cols: tuple[int, ...],
    ts: np.ndarray[Any, Any],
    entity: np.ndarray[Any, Any],
    attr: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    attr_arrays: dict[str, np.ndarray[Any, Any]],
) -> None:
    data: dict[str, Any] = {"ts": ts, "entity": entity}
    for name in ATTR_COLUMNS:
        column = attr_arrays[name][attr]
        if any(v is not None for v in attr_arrays[name][np.unique(attr)]):
            data[name] = column
    by_col = np.ascontiguousarray(values.T)  # each metric's values contiguous for the scan
    for j, c in enumerate(cols):
        data[f"m{c}"] = by_col[j]
    _insert(con, "samples", data)


def insert_entities(con: duckdb.DuckDBPyConnection, rows: list[tuple[int, Labels]]) -> None:
    data = {
        "id": np.array([r[0] for r in rows], dtype=np.int32),
        "labels": np.array(
            [orjson.dumps(r[1], option=orjson.OPT_SORT_KEYS).decode() for r in rows], dtype=object
        ),
    }
    _insert(con, "entities", data)


def insert_events(con: duckdb.DuckDBPyConnection, events: list[tuple[float, str, str, str]]) -> None:
    data = {
        "ts": np.array([e[0] for e in events], dtype=np.float64),
        "kind": np.array([e[1] for e in events], dtype=object),
        "labels": np.array([e[2] for e in events], dtype=object),
        "data": np.array([e[3] for e in events], dtype=object),
    }
    _insert(con, "events", data)


def insert_training(con: duckdb.DuckDBPyConnection, rows: list[TrainingRow]) -> None:
    """One INSERT per distinct metric set (ranks of a job report the same metrics every step)."""
    groups: dict[tuple[int, ...], list[TrainingRow]] = {}
    for r in rows:
        groups.setdefault(r.cols, []).append(r)
    for cols, group in groups.items():
        data: dict[str, Any] = {
            "ts": np.array([r.ts for r in group], dtype=np.float64),
            "job": np.array([r.job for r in group], dtype=object),
            "rank": np.array([r.rank for r in group], dtype=np.int32),
            "step": np.array([r.step for r in group], dtype=np.int64),
            "labels": np.array([r.labels for r in group], dtype=object),
        }
        exprs: dict[str, str] = {}
        if cols:
            values = np.array([r.values for r in group], dtype=np.float64).T.copy()
            for c, column in zip(cols, values, strict=True):
                data[f"t{c}"] = column
                # The numpy scan reads NaN as NULL (missing); a reported NaN loss must stay NaN.
                nan = np.isnan(column)
                if nan.any():
                    data[f"_nan{c}"] = nan
                    exprs[f"t{c}"] = f"CASE WHEN _nan{c} THEN 'NaN'::DOUBLE ELSE t{c} END"
        _insert(con, "training", data, exprs)


def insert_batch_ids(con: duckdb.DuckDBPyConnection, ids: list[str], received: float, first_seq: int) -> None:
    if len(ids) <= 16:  # a few ids (the common group commit) are cheapest as bound VALUES
        rows = ", ".join(["(?, ?, ?)"] * len(ids))
        params = [v for k, bid in enumerate(ids) for v in (bid, received, first_seq + k)]
        con.execute(f"INSERT INTO batch_ids VALUES {rows}", params)
        return
    data = {
        "id": np.array(ids, dtype=object),
        "received": np.full(len(ids), received, dtype=np.float64),
        "seq": np.arange(first_seq, first_seq + len(ids), dtype=np.int64),
    }
    _insert(con, "batch_ids", data)


def insert_buckets(con: duckdb.DuckDBPyConnection, buckets: np.ndarray[Any, Any]) -> None:
    _insert(con, "rollup_dirty", {"bucket": buckets.astype(np.int64)})
