"""DuckDB allocates from a jemalloc of its own, outside glibc's ``malloc_trim`` and outside
``duckdb_memory()``; what a seal frees stays resident there as dirty pages until an arena purges
them (issue 13 (d): a hub's RSS stood tens of MiB above its level after each upkeep). The upkeep
asks DuckDB to purge once at its end, and the store reports the allocator's states."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.duckdb.allocator import ALLOCATOR
from store.test_cache_bound import NOW, _fill

MIB = 2**20

pytestmark = pytest.mark.skipif(
    not ALLOCATOR.available, reason="this DuckDB build does not export its jemalloc's mallctl"
)


def _per_node(store: DuckDBStore) -> list[float]:
    """m7's count, min, max and mean per node over the 30 filled minutes."""
    rows = store.aggregate("m7", "node", NOW - 3600 - 1800, NOW - 3600)
    rows.sort(key=lambda r: str(r["group"]))
    return [float(r[k]) for r in rows for k in ("count", "min", "max", "mean")]


def test_an_upkeep_returns_what_its_seal_freed_to_the_os(tmp_path: Path) -> None:
    # a cache bound far above what is cached: the upkeep sheds nothing, so only the purge is tested
    with DuckDBStore(
        str(tmp_path / "a.duckdb"), durable=False, cache_limit="512MB", raw_retention_s=1e9
    ) as store:
        samples = _fill(store, 1800)
        before = _per_node(store)
        sealed = store.rollup(NOW)["sealed_rows"]
        report = store.compact(NOW)
        held = ALLOCATOR.read()
        assert sealed * 32 == samples  # the seal moved (and freed) every hot row: ~50-70 MiB dirty without
        assert held["dirty"] < 2 * MIB, {k: v // MIB for k, v in held.items()}
        assert report["allocator_purged"] == 1
        # purged, not lost: every sample still counted and the same series read back
        assert store.stats()["raw_rows"] * 32 == samples
        assert len(before) == 8 * 4 and _per_node(store) == pytest.approx(before)


def test_an_upkeep_that_frees_nothing_does_not_purge(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "a.duckdb"), durable=False, cache_limit="512MB") as store:
        assert store.rollup(NOW)["sealed_rows"] == 0
        assert store.compact(NOW)["allocator_purged"] == 0


def test_the_store_reports_its_allocators_states(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "a.duckdb"), durable=False) as store:
        _fill(store, 120, gpus=8, metrics=4)
        held = store.stats()["allocator"]
    assert {"allocated", "active", "dirty", "resident", "mapped", "retained"} <= set(held)
    assert held["allocated"] > 0 and held["resident"] >= held["active"] >= held["allocated"]
