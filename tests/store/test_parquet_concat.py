"""Parquet files joined row group by row group: DuckDB reads the joined file as the files in order,
with each row group's statistics and bloom filters, and files it cannot join are refused before
anything is written."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import duckdb
import pytest

from gpuscope.store.duckdb import parquet_concat
from gpuscope.store.duckdb.chunks import PARQUET_OPTIONS


def piece(con: duckdb.DuckDBPyConnection, path: Path, k: int, rows: int, extra: str = "") -> Path:
    con.execute(
        f"COPY (SELECT i + {k * rows} AS ts, 'gpu-' || (i % 64) AS entity, (i % 7)::INTEGER AS a, "
        f"(i * 0.5)::FLOAT AS m1{extra} FROM range({rows}) t(i) ORDER BY entity, ts) "
        f"TO '{path}' ({PARQUET_OPTIONS})"
    )
    return path


def test_a_footer_decodes_and_encodes_to_the_same_bytes(tmp_path: Path) -> None:
    con = duckdb.connect()
    path = piece(con, tmp_path / "p.parquet", 0, 200_000)
    raw = path.read_bytes()
    with path.open("rb") as f:
        meta, start = parquet_concat.read_footer(f)
    assert parquet_concat.encode(meta) == raw[start:-8]


def test_joined_files_read_as_the_files_in_order_with_their_statistics(tmp_path: Path) -> None:
    con = duckdb.connect()
    # 200,000 rows: two row groups per file, each with a dictionary page and a bloom filter
    paths = [piece(con, tmp_path / f"p{k}.parquet", k, 200_000) for k in range(3)]
    out = tmp_path / "joined.parquet"
    with out.open("wb") as f:
        assert parquet_concat.concat(paths, f) == 600_000
    files = ", ".join(f"'{p}'" for p in paths)
    assert (
        con.execute(f"SELECT * FROM '{out}' EXCEPT ALL SELECT * FROM read_parquet([{files}])").fetchall()
        == []
    )
    assert con.execute(f"SELECT count(*) FROM '{out}'").fetchall() == [(600_000,)]
    joined = con.execute(f"SELECT ts FROM '{out}'").fetchall()
    parts = [r for p in paths for r in con.execute(f"SELECT ts FROM '{p}'").fetchall()]
    assert joined == parts  # row groups in the order of the files
    meta = "SELECT row_group_num_rows, stats_min, stats_max, bloom_filter_length FROM parquet_metadata('{}') "
    meta += "WHERE path_in_schema = 'entity' ORDER BY row_group_id"
    groups = [g for p in paths for g in con.execute(meta.format(p)).fetchall()]
    assert con.execute(meta.format(out)).fetchall() == groups
    assert all(g[3] for g in groups)  # bloom filters written, and found at their shifted offsets
    lookup = "SELECT count(*), sum(ts) FROM {} WHERE entity = 'gpu-5' AND ts > 250000"
    assert (
        con.execute(lookup.format(f"'{out}'")).fetchall()
        == con.execute(lookup.format(f"read_parquet([{files}])")).fetchall()
    )


def test_files_of_different_schemas_are_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    con = duckdb.connect()
    a = piece(con, tmp_path / "a.parquet", 0, 1000)
    b = piece(con, tmp_path / "b.parquet", 1, 1000, extra=", 1.0::FLOAT AS m2")
    target = io.BytesIO()
    with pytest.raises(parquet_concat.NotJoinable, match="schemas differ"):
        parquet_concat.concat([a, b], target)
    assert target.getvalue() == b""


def test_a_file_that_is_not_parquet_is_refused(tmp_path: Path) -> None:
    con = duckdb.connect()
    a = piece(con, tmp_path / "a.parquet", 0, 1000)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(a.read_bytes()[:-4])
    with pytest.raises(parquet_concat.NotJoinable, match="not a Parquet file"):
        parquet_concat.concat([a, bad], io.BytesIO())


def test_a_merge_of_many_wide_files_holds_one_footer_at_a_time(tmp_path: Path) -> None:
    """An hour's merge joins 60 pieces of 53 columns, 5 row groups each: holding every footer's
    tree until the footer was written cost ~77 MiB of small Python objects at its peak (the soak's
    hour of 64 nodes), which a serving hub's arenas kept. One footer at a time, and the row groups'
    bytes: the joined file is the same."""
    con = duckdb.connect()
    metrics = ", ".join(f"(i * {m} % 977)::FLOAT AS m{m}" for m in range(50))
    paths = []
    for k in range(60):
        path = tmp_path / f"p{k}.parquet"
        con.execute(
            f"COPY (SELECT i + {k * 5000} AS ts, 'gpu-' || (i % 64) AS entity, (i % 7)::INTEGER AS a, "
            f"{metrics} FROM range(5000) t(i) ORDER BY entity, ts) TO '{path}' "
            "(FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2, ROW_GROUP_SIZE 1024)"
        )
        paths.append(path)
    footers = 0
    for path in paths:
        with path.open("rb") as f:
            footers += path.stat().st_size - parquet_concat.read_footer(f)[1]
    out = tmp_path / "joined.parquet"
    tracemalloc.start()
    try:
        with out.open("wb") as f:
            rows = parquet_concat.concat(paths, f)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == 300_000
    assert (
        con.execute(f"SELECT count(*), sum(ts), sum(m7) FROM '{out}'").fetchall()
        == con.execute(
            f"SELECT count(*), sum(ts), sum(m7) FROM read_parquet([{', '.join(repr(str(p)) for p in paths)}])"
        ).fetchall()
    )
    # the copy buffer, the row groups' bytes (0.7 MiB of footers here) and one footer's tree: 3.4
    # MiB; every tree at once held 29 MiB
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB held at the peak, footers {footers / 2**20:.1f} MiB"
