"""An agent stopped cleanly tells the hub it is leaving: no node_unreachable fires, now or after the
hub reopens on its kept store; a node that just goes silent still pages."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from gpuscope.agent.agent import Agent
from gpuscope.collect.base import Collected, Collector
from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer


class TwoGpus(Collector):
    """A node with two busy GPUs (what the NVML collector would report)."""

    name: ClassVar[str] = "two-gpus"

    def collect(self, now: float) -> Collected:
        entities = [{"node": self.node, "gpu": str(g)} for g in range(2)]
        return Collected(frames=[Frame(now, ["gpu_utilization_percent"], entities, np.full((2, 1), 90.0))])


def unreachable(hub: Hub) -> set[str]:
    return {a.entity["node"] for a in hub.firing() if a.rule == "node_unreachable"}


def test_a_clean_stop_pages_nobody_and_a_reopened_hub_remembers_it(tmp_path: Path) -> None:
    path = tmp_path / "hub.duckdb"
    hub = Hub(DuckDBStore(str(path)))
    server = HubServer(hub, "127.0.0.1", 0, evaluate_interval=None)  # the test drives evaluation
    server.start()
    agents = {
        node: Agent(server.url, node, [TwoGpus(node)], spool_dir=tmp_path / node, fsync=False)
        for node in ("node-0", "node-1", "node-2")
    }
    t = time.time() - 30
    try:
        for k in range(20):
            for agent in agents.values():
                agent.step(now=t + k)
            hub.evaluate(t + k)
        agents["node-0"].leave("rolling upgrade")  # node-0 stops cleanly; node-1 just goes silent
        for k in range(20, 60):
            agents["node-2"].step(now=t + k)  # node-2 keeps reporting: the hub itself is fine
            hub.evaluate(t + k)
        assert unreachable(hub) == {"node-1"}
        assert not [g for g in hub.productivity.gpu_states() if g["node"] == "node-0"]
    finally:
        for agent in agents.values():
            agent.close()
        server.stop()

    reopened = Hub(DuckDBStore(str(path)))
    still = TwoGpus("node-2")
    try:
        reopened.resume(t + 60)
        for k in range(60, 90):
            reopened.ingest(Batch("node-2", frames=still.collect(t + k).frames))
            reopened.evaluate(t + k)
        assert "node-0" not in unreachable(reopened)
        assert "node-1" in unreachable(reopened)  # still silent, still firing
    finally:
        reopened.store.close()
