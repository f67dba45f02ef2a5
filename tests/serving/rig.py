"""A real hub on loopback with the quality monitor and lineage routes mounted, for serving tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuscope.hub import Hub
from gpuscope.lineage import LineageRegistry, for_hub
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.slo import Slo
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.lineage_api import LineageApi
from gpuscope.web.server import HubServer


@dataclass
class Rig:
    url: str
    hub: Hub
    store: DuckDBStore
    monitor: QualityMonitor
    lineage: LineageRegistry


@contextmanager
def hub_rig(tmp: Path, slos: Sequence[Slo] = (), reference_count: int = 1000) -> Iterator[Rig]:
    store = DuckDBStore(str(tmp / "hub.duckdb"))
    hub = Hub(store)
    monitor = QualityMonitor(slos, reference_count=reference_count, current_windows=3)
    monitor.attach(hub)
    lineage = for_hub(hub)
    server = HubServer(hub, "127.0.0.1", 0)
    server.api.app.router.routes.extend(LineageApi(lineage, server.api._authorize_write).routes())
    server.start()
    try:
        yield Rig(server.url, hub, store, monitor, lineage)
    finally:
        server.stop()
        lineage.close()
