"""A simulated node as a collector, so the demo's telemetry goes through a real agent.

The demo's driver feeds each node's simulated batch for the current tick; the agent collects it
like any other source and sends it over HTTP, spooling if the hub is away.
"""

from __future__ import annotations

import threading

from gpuscope.collect.base import Collected, Collector, register_collector
from gpuscope.model import Batch


@register_collector
class SimulatedNode(Collector):
    """Hands over what the simulator produced for one node since the last round."""

    name = "simulated"

    def __init__(self, node: str, *, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self._lock = threading.Lock()
        self._pending = Collected()

    def feed(self, batch: Batch) -> None:
        with self._lock:
            self._pending.frames.extend(batch.frames)
            self._pending.events.extend(batch.events)
            self._pending.training.extend(batch.training)

    def collect(self, now: float) -> Collected:
        with self._lock:
            out, self._pending = self._pending, Collected()
        return out
