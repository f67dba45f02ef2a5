"""A hub's API served in the test's own process (imports the whole web stack: kept out of
support.py, which every test session imports)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer


def memory_hub(stored: Iterable[Batch] = ()) -> Hub:
    """A hub over an in-memory store that already holds ``stored`` (written to the store directly:
    the detectors have not seen them)."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    for batch in stored:
        hub.store.append(batch)
    return hub


@contextlib.contextmanager
def serve_hub(hub: Hub, **options: Any) -> Iterator[HubServer]:
    """``hub``'s API on a free loopback port (``options`` are HubServer's), stopped on exit."""
    server = HubServer(hub, "127.0.0.1", 0, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
