"""A hub whose findings the test scripts, with the alerting service attached to it on a manual clock."""

from __future__ import annotations

from typing import Any

from alert.sink import Clock
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.model import Finding
from gpuscope.store.duckdb import DuckDBStore


class Scripted(Detector):
    """Restates whatever findings the test sets, as a detector restates conditions that hold."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def evaluate(self, now: float) -> list[Finding]:
        return list(self.findings)


class Rig:
    def __init__(self, cfg: dict[str, Any], clock: Clock) -> None:
        self.clock = clock
        self.store = DuckDBStore(":memory:", durable=False)
        self.hub = Hub(self.store)
        self.hub.alerts.resolve_after = 0.0
        self.script = Scripted()
        self.hub.detection = DetectionEngine([self.script])
        self.service = AlertingService(self.hub, parse_alerting(cfg), clock=clock)

    def step(self, seconds: float, findings: list[Finding] | None = None) -> None:
        """Advance the clock, evaluate, triage and dispatch what changed, tick the alerting
        layer and deliver what is due."""
        if findings is not None:
            self.script.findings = findings
        self.clock.t += seconds
        self.hub.evaluate(self.clock.t)
        assert self.service.drain(10.0)
        self.service.tick()
        self.service.outbox.deliver_due()

    def close(self) -> None:
        self.service.db.close()
        self.store.close()


def lost(gpu: str = "3", node: str = "node-1") -> Finding:
    return Finding("gpu_lost", {"node": node, "gpu": gpu}, f"GPU {gpu} on {node} is lost")


def hot(gpu: str = "2", node: str = "node-1") -> Finding:
    return Finding("gpu_thermal_throttle", {"node": node, "gpu": gpu}, f"GPU {gpu} on {node} throttles")
