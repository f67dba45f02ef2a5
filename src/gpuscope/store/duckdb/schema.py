"""Tables of the DuckDB store, opening a file safely, and the meta table.

Telemetry is wide: one row per (time, entity) with one FLOAT column per metric, because a GPU's
metrics of one tick arrive together and DuckDB compresses each column on its own. Metric names
map to numbered columns (``m0``, ``m1``, ...) so any name is safe and case never collides.
"""

from __future__ import annotations

import os
from typing import Any

import duckdb

from gpuscope.store.duckdb import gpu_time
from gpuscope.store.errors import StoreError
from gpuscope.store.memory_size import MEMORY_SIZE
from gpuscope.store.registry import ATTR_COLUMNS

FORMAT = "gpuscope-store"
SCHEMA_VERSION = 1
BLOCK_SIZE = 65_536

ROLLUP_TABLES = ("rollup_1m", "rollup_1h")
ROLLUP_PARTS = ("n", "a", "lo", "hi")  # per metric: sample count, mean, min, max

_ATTR_DDL = ", ".join(f"{c} VARCHAR" for c in ATTR_COLUMNS)

DDL = (
    "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    # No key indexes below: uniqueness is kept by the in-memory registries, and each index would
    # cost a block of its own in the file.
    "CREATE TABLE metric_columns (name VARCHAR NOT NULL, col INTEGER NOT NULL)",
    "CREATE TABLE training_columns (name VARCHAR NOT NULL, col INTEGER NOT NULL)",
    "CREATE TABLE entities (id INTEGER NOT NULL, labels VARCHAR NOT NULL)",
    # Hot raw telemetry (appends land here); closed chunks move to Parquet files (see _chunks).
    f"CREATE TABLE samples (ts BIGINT NOT NULL, entity INTEGER NOT NULL, {_ATTR_DDL})",
    "CREATE TABLE chunks (file VARCHAR NOT NULL, lo BIGINT NOT NULL, hi BIGINT NOT NULL, "
    "rows BIGINT NOT NULL, bytes BIGINT NOT NULL, cols VARCHAR NOT NULL)",
    f"CREATE TABLE rollup_1m (bucket BIGINT NOT NULL, entity INTEGER NOT NULL, {_ATTR_DDL})",
    f"CREATE TABLE rollup_1h (bucket BIGINT NOT NULL, entity INTEGER NOT NULL, {_ATTR_DDL})",
    "CREATE TABLE rollup_dirty (bucket BIGINT NOT NULL)",
    "CREATE TABLE events (ts DOUBLE NOT NULL, kind VARCHAR NOT NULL, labels VARCHAR NOT NULL, "
    "data VARCHAR NOT NULL)",
    "CREATE TABLE training (ts DOUBLE NOT NULL, job VARCHAR NOT NULL, rank INTEGER NOT NULL, "
    "step BIGINT NOT NULL, labels VARCHAR NOT NULL)",
    "CREATE TABLE alerts (id VARCHAR PRIMARY KEY, started_at DOUBLE NOT NULL, resolved_at DOUBLE, "
    "doc VARCHAR NOT NULL)",
    "CREATE TABLE batch_ids (id VARCHAR NOT NULL, received DOUBLE NOT NULL, seq BIGINT NOT NULL)",
)


def metric_column_ddl(col: int) -> list[str]:
    """Statements adding metric column ``col`` to every telemetry and rollup table."""
    out = [f"ALTER TABLE samples ADD COLUMN m{col} FLOAT"]
    for t in ROLLUP_TABLES:
        out.append(f"ALTER TABLE {t} ADD COLUMN n{col} INTEGER")
        out.extend(f"ALTER TABLE {t} ADD COLUMN {p}{col} FLOAT" for p in ROLLUP_PARTS[1:])
    return out


def training_column_ddl(col: int) -> list[str]:
    # DOUBLE, not FLOAT: a loss of 1e-9 or a step time must round-trip, and NaN/Inf are kept.
    return [f"ALTER TABLE training ADD COLUMN t{col} DOUBLE"]


def one(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...] | None:
    """The first row of a query, reading the whole result.

    ``fetchone()`` would leave the result open, and with it a transaction: DuckDB then refuses to
    checkpoint once another connection has altered a table.
    """
    rows = con.execute(sql, params or []).fetchall()
    return tuple(rows[0]) if rows else None


def get_meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    row = one(con, "SELECT value FROM meta WHERE key = ?", [key])
    return None if row is None else str(row[0])


def set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])


def _table_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchall()
    return {str(r[0]) for r in rows}


def _create(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("BEGIN")
    for stmt in DDL:
        con.execute(stmt)
    set_meta(con, "format", FORMAT)
    set_meta(con, "schema_version", str(SCHEMA_VERSION))
    set_meta(con, "attribution", ",".join(ATTR_COLUMNS))
    con.execute("COMMIT")


def _validate(con: duckdb.DuckDBPyConnection, path: str, tables: set[str]) -> None:
    if "meta" not in tables:
        raise StoreError(
            f"{path} is a DuckDB database but not a gpuscope store (it has no meta table); "
            "refusing to modify it"
        )
    fmt = get_meta(con, "format")
    if fmt != FORMAT:
        raise StoreError(f"{path} is not a gpuscope store (format {fmt!r}, expected {FORMAT!r})")
    raw_version = get_meta(con, "schema_version")
    try:
        version = int(raw_version or "")
    except ValueError:
        raise StoreError(f"{path}: unreadable schema version {raw_version!r}") from None
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer gpuscope (store schema {version}); this version "
            f"reads schema {SCHEMA_VERSION} at most. Upgrade gpuscope to open it."
        )
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"{path} has store schema {version}, which this version cannot migrate "
            f"(current schema {SCHEMA_VERSION})"
        )
    attribution = get_meta(con, "attribution")
    if attribution != ",".join(ATTR_COLUMNS):
        raise StoreError(
            f"{path} stores attribution labels {attribution!r} per row, this version "
            f"expects {','.join(ATTR_COLUMNS)!r}"
        )
    expected = {stmt.split()[2] for stmt in DDL}
    missing = expected - tables
    if missing:
        raise StoreError(f"{path}: gpuscope store is damaged, missing tables {sorted(missing)}")


def _size(value: str) -> str:
    """A DuckDB memory size (``512MB``, ``1GiB``); anything else is refused before it reaches SQL."""
    if not MEMORY_SIZE.fullmatch(value):
        raise StoreError(f"memory_limit: {value!r} is not a size such as '512MB' or '1GiB'")
    return value


def open_database(
    path: str, checkpoint_bytes: int, memory_limit: str | None = None
) -> duckdb.DuckDBPyConnection:
    """Open or create a store; a foreign, damaged or newer file raises :class:`StoreError`."""
    if path != ":memory:" and os.path.isdir(path):
        raise StoreError(f"{path} is a directory, not a store file")
    try:
        # 64 KiB blocks (new files only): the file holds the hot table, rollups and small tables;
        # with DuckDB's 256 KiB default each small table or rollup segment wastes most of a block.
        con = duckdb.connect(path, config={"default_block_size": str(BLOCK_SIZE)})
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {path} as a DuckDB database: {exc}") from None
    try:
        con.execute(f"SET checkpoint_threshold = '{int(checkpoint_bytes)}B'")
        # DuckDB allocates with a jemalloc of its own (not glibc's: malloc_trim cannot reach it),
        # which without its background threads keeps freed pages until that arena allocates
        # again: each minute's seal left a hub 15-30 MiB above its level, by chance how much.
        con.execute("SET allocator_background_threads = true")
        if memory_limit is not None:
            con.execute(f"SET memory_limit = '{_size(memory_limit)}'")
        tables = _table_names(con)
        if tables:
            _validate(con, path, tables)
        else:
            _create(con)
        con.execute(gpu_time.DDL)
    except StoreError:
        con.close()
        raise
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"cannot use {path} as a gpuscope store: {exc}") from None
    return con
