"""Store fixtures: a file-backed store in each write mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.store.duckdb import DuckDBStore


@pytest.fixture(params=[True, False], ids=["durable", "buffered"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DuckDBStore]:
    s = DuckDBStore(str(tmp_path / "store.duckdb"), durable=request.param)
    yield s
    s.close()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[DuckDBStore]:
    s = DuckDBStore(str(tmp_path / "store.duckdb"))
    yield s
    s.close()
