"""A real hub serving a simulated cluster: the data every dashboard test reads.

The scenario is replayed in virtual time so that it ends now (its last tick just before the
jobs end, so they still hold their GPUs), through the real ingest, detectors, alert engine and
alerting service; the hub then serves it over HTTP on a free loopback port. The evaluator is
stopped before the server starts so nothing fires or resolves while the browser looks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import AlertingSettings
from gpuscope.hub import Hub
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import load_scenario
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer

SCENARIO = Path(__file__).parent / "fixtures" / "dashboard.yaml"


@dataclass
class Served:
    hub: Hub
    server: HubServer
    t0: float

    @property
    def url(self) -> str:
        return self.server.url


def replay(hub: Hub, path: Path = SCENARIO) -> float:
    """Feed the scenario into ``hub`` so that its last tick lands at about now; returns its t0."""
    scenario = load_scenario(path)
    t0 = time.time() - scenario.duration
    for tick in Simulator(scenario, t0=t0).ticks():
        if tick.t >= scenario.duration - 1:
            break
        for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
            hub.ingest(batch)
        hub.evaluate(t0 + tick.t)
    return t0


@pytest.fixture(scope="session")
def served() -> Iterator[Served]:
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store, price_per_gpu_hour=2.5)
    alerting = AlertingService(hub, AlertingSettings())
    t0 = replay(hub)
    server = HubServer(hub, "127.0.0.1", 0, alerting=alerting, evaluate_interval=None)  # replayed time
    server.start()
    try:
        yield Served(hub, server, t0)
    finally:
        server.stop()
