"""A real hub process shared by the SDK's end-to-end tests (each test uses its own job name)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import HubProcess, free_port


@pytest.fixture(scope="module")
def sdk_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    tmp = tmp_path_factory.mktemp("sdk-hub")
    hub = HubProcess(tmp, free_port(), tmp / "hub.duckdb")
    try:
        hub.wait_ready()
        yield hub
    finally:
        hub.close()


@pytest.fixture
def local_hub(tmp_path: Path) -> Iterator[HubServer]:
    """A real hub (store, detectors, HTTP API) served from a thread of the test process."""
    store = DuckDBStore(str(tmp_path / "hub.duckdb"))
    server = HubServer(Hub(store), "127.0.0.1", free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
        store.close()
