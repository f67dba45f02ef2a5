"""A hub's API served in the test's own process (imports the whole web stack: kept out of
support.py, which every test session imports)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gpuscope.hub import Hub
from gpuscope.web.server import HubServer


@contextlib.contextmanager
def serve_hub(hub: Hub, **options: Any) -> Iterator[HubServer]:
    """``hub``'s API on a free loopback port (``options`` are HubServer's), stopped on exit."""
    server = HubServer(hub, "127.0.0.1", 0, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
