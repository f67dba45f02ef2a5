"""Opening something that is not a usable gpuscope store fails loudly and changes nothing."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.errors import StoreError
from store.store_helpers import frame, gpu


def test_foreign_duckdb_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="not a gpuscope store"):
        DuckDBStore(str(path))
    con = duckdb.connect(str(path))
    assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("orders",)]
    con.close()


def test_file_that_is_not_duckdb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello, this is not a database\n" * 1000)
    with pytest.raises(StoreError, match="cannot open"):
        DuckDBStore(str(path))
    assert path.read_bytes().startswith(b"hello")


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "s.duckdb")
    DuckDBStore(path).close()
    con = duckdb.connect(path)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreError, match="newer gpuscope"):
        DuckDBStore(path)


def test_corrupt_store_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with DuckDBStore(str(path)) as store:
        store.append(Batch("s", frames=[frame(1.0, ["util"], [gpu("n0", 0)], [[1.0]])]))
        store.checkpoint()
    data = bytearray(path.read_bytes())
    data[4096:12288] = b"\xff" * 8192  # both database headers
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError):
        DuckDBStore(str(path))


def test_truncated_store_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with DuckDBStore(str(path)) as store:
        store.append(Batch("s", frames=[frame(1.0, ["util"], [gpu("n0", 0)], [[1.0]])]))
        store.checkpoint()
    path.write_bytes(path.read_bytes()[:20_000])
    with pytest.raises(StoreError):
        DuckDBStore(str(path))


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="directory"):
        DuckDBStore(str(tmp_path))


def test_duckdb_memory_is_bounded_by_default_and_a_bad_limit_is_named(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "a.duckdb"))
    try:
        gpus = [gpu("node-0", g) for g in range(8)]
        for i in range(50):
            rows = [[50.0 + i, 200.0]] * 8
            store.append(Batch(source="node-0", frames=[frame(1e9 + i, ["temp", "power"], gpus, rows)]))
        limit = store._cursor().execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit is not None and limit[0] in {"244.1 MiB", "256.0 MB", "244.1MiB"}, limit
        assert 0 < sum(store.memory().values()) <= 256_000_000
    finally:
        store.close()
    with pytest.raises(StoreError, match="memory_limit"):
        DuckDBStore(str(tmp_path / "b.duckdb"), memory_limit="512MB'; DROP TABLE x; --")
