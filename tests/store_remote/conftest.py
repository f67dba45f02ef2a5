"""Fixtures: a fresh real TSDB per test, and a store fixture parametrised over every backend, so
user-visible behaviour is checked the same way on each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuscope.store.base import Store
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.remote.local import LocalTSDB
from store_remote.tsdbs import BACKENDS, ReadYourWrites, StoreFactory, start_tsdb


@pytest.fixture
def tsdb(request: pytest.FixtureRequest) -> Iterator[LocalTSDB]:
    """A fresh TSDB per test (each starts in about 0.2 s): no test sees another's series."""
    db = start_tsdb(request.param)
    yield db
    db.stop()


@pytest.fixture(params=BACKENDS)
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """``make_store(max_entities=...)``: a store of the backend under test (meta in DuckDB memory)."""
    kind = request.param
    opened: list[Store] = []
    dbs: list[LocalTSDB] = []

    def make(max_entities: int = 1000, **kwargs: Any) -> Store:
        store: Store
        if kind == "duckdb":
            store = DuckDBStore(":memory:", max_entities=max_entities)
        else:
            if not dbs:
                dbs.append(start_tsdb(kind))
            store = ReadYourWrites(
                dbs[0], DuckDBStore(":memory:"), max_entities=max_entities, retry_s=5, **kwargs
            )
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
    for db in dbs:
        db.stop()
