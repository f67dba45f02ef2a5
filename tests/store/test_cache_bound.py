"""DuckDB's buffer pool keeps every table block it wrote or read until it reaches ``memory_limit``;
each upkeep sheds the cached blocks beyond ``storage.cache_limit`` (issue 13 (d): a 64-node hub's
cache grew by ~1.2 MiB a minute). Measured with DuckDB's own accounting (``duckdb_memory()``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.duckdb.upkeep import SHED_SLACK_BYTES
from gpuscope.store.memory_size import size_bytes
from gpuscope.store.settings import StorageConfigError, parse_storage
from store.store_helpers import frame, gpu

MIB = 2**20
NOW = 1_800_000_000.0


def _fill(store: DuckDBStore, seconds: int, gpus: int = 64, metrics: int = 32) -> int:
    """Noisy rows (little to compress) ending an hour before NOW; the samples written."""
    rng = np.random.default_rng(1)
    ents = [gpu(f"n{i // 8}", i % 8) for i in range(gpus)]
    names = [f"m{k}" for k in range(metrics)]
    start = int(NOW) - 3600 - seconds
    for t0 in range(start, start + seconds, 60):
        values = rng.random((60, gpus, metrics)).tolist()
        frames = [frame(float(t0 + k), names, ents, values[k]) for k in range(60)]
        store.append(Batch("test", frames=frames))
    return seconds * gpus * metrics


def _cached(store: DuckDBStore) -> int:
    return store.memory().get("BASE_TABLE", 0)


def test_the_upkeep_sheds_cached_table_blocks_beyond_the_cache_limit(tmp_path: Path) -> None:
    with DuckDBStore(
        str(tmp_path / "c.duckdb"), durable=False, cache_limit="1MB", raw_retention_s=1e9
    ) as store:
        samples = _fill(store, 1800)
        store.checkpoint()  # the rows are written to the file, and their blocks stay in the pool
        before = _cached(store)
        assert before > size_bytes("1MB") + 2 * SHED_SLACK_BYTES, before
        report = store.compact(NOW)
        after = _cached(store)
        assert after <= size_bytes("1MB") + SHED_SLACK_BYTES, (before, after)
        assert report["cache_shed_bytes"] >= before - after - MIB
        # evicted, not lost: read back from disk; and the pool's limit is what it was
        assert store.stats()["raw_rows"] * 32 == samples
        limit = store._cursor().execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit is not None and limit[0] in {"244.1 MiB", "244.1MiB"}, limit


def test_a_cache_within_its_bound_is_left_alone(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "c.duckdb"), durable=False, cache_limit="512MB") as store:
        _fill(store, 300)
        store.checkpoint()
        before = _cached(store)
        assert store.compact(NOW)["cache_shed_bytes"] == 0
        assert _cached(store) >= before - MIB


def test_an_in_memory_store_has_no_disk_to_shed_to() -> None:
    with DuckDBStore(":memory:", durable=False, cache_limit="1MB") as store:
        _fill(store, 300)
        assert store.compact(NOW)["cache_shed_bytes"] == 0
        assert store.stats()["raw_rows"] == 300 * 64


@pytest.mark.parametrize("bad", ["lots", "1GB'; DROP TABLE x", 32])
def test_a_bad_cache_limit_is_refused_by_name(bad: object) -> None:
    with pytest.raises(StorageConfigError, match=r"storage\.cache_limit"):
        parse_storage({"cache_limit": bad})


def test_duckdbs_allocator_returns_freed_pages_in_the_background(tmp_path: Path) -> None:
    """DuckDB's own jemalloc purges freed pages only from background threads (glibc's malloc_trim
    cannot reach it); without them a seal's pages stayed resident until the next allocation."""
    with DuckDBStore(str(tmp_path / "c.duckdb"), durable=False) as store:
        row = store._cursor().execute("SELECT current_setting('allocator_background_threads')").fetchone()
        assert row is not None and row[0] is True
