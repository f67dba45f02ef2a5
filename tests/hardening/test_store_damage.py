"""A damaged store, or one from an older schema: ``gpuscope hub`` refuses to start, says which
file and what to do, and leaves every file as it was (no silent reset)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from gpuscope.cli import main
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from store.store_helpers import frame, gpu
from support import free_port


def make_store(path: Path) -> None:
    """A store with one sealed chunk file (hour 0) and rows in the DuckDB file (hour 3)."""
    with DuckDBStore(str(path)) as store:
        for ts in (10.0, 20.0, 3 * 3600.0 + 10):
            store.append(Batch("s", frames=[frame(ts, ["util"], [gpu("n0", 0)], [[ts]])]))
        store.rollup(3 * 3600.0 + 20)
        assert len(store.chunks.all()) == 1
        store.checkpoint()


def chunk_file(db: Path) -> Path:
    (chunk,) = Path(str(db) + ".chunks").glob("chunk-*.parquet")
    return chunk


def overwrite_headers(db: Path) -> Path:
    data = bytearray(db.read_bytes())
    data[:12288] = bytes(range(256)) * 48  # the file header and both database headers
    db.write_bytes(bytes(data))
    return db


def truncate(db: Path) -> Path:
    db.write_bytes(db.read_bytes()[:20_000])
    return db


def truncate_chunk(db: Path) -> Path:
    chunk = chunk_file(db)
    chunk.write_bytes(chunk.read_bytes()[:-100])
    return chunk


def scribble_chunk_tail(db: Path) -> Path:
    chunk = chunk_file(db)
    data = bytearray(chunk.read_bytes())
    data[-64:] = b"\x00" * 64  # the footer, same size
    chunk.write_bytes(bytes(data))
    return chunk


def older_schema(db: Path) -> Path:
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    con.close()
    return db


def digests(db: Path) -> dict[str, str]:
    files = [db, *sorted(Path(str(db) + ".chunks").glob("*"))]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def start_hub(db: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``gpuscope hub`` in process (it returns before serving when the store is refused)."""
    code = main(["hub", "--listen", f"127.0.0.1:{free_port()}", "--db", str(db)])
    return code, " ".join(capsys.readouterr().err.split())  # rich may wrap long lines


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (overwrite_headers, "cannot open"),
        (truncate, ""),
        (truncate_chunk, "bytes where"),
        (scribble_chunk_tail, "not a Parquet file"),
        (older_schema, "store schema 0"),
    ],
    ids=["random-bytes", "truncated", "chunk-truncated", "chunk-footer", "older-schema"],
)
def test_hub_refuses_a_damaged_or_old_store_and_leaves_it_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[Path], Path], says: str
) -> None:
    db = tmp_path / "hub.duckdb"
    make_store(db)
    named = damage(db)
    before = digests(db)
    code, message = start_hub(db, capsys)
    assert code == 2, message
    assert str(named) in message and says in message
    assert "The store was not modified" in message and "backup" in message
    assert digests(db) == before
    assert not Path(str(db) + ".wal").exists()


def test_the_hub_process_exits_with_the_message_not_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "hub.duckdb"
    make_store(db)
    truncate_chunk(db)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuscope.cli",
            "hub",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "chunk file" in run.stderr and "not modified" in run.stderr
