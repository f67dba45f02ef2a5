"""The hub's core: ingest → store → detect → alert, independent of HTTP and of the clock.

The HTTP server (:mod:`gpuscope.web.api`), the virtual-time evaluation (:mod:`gpuscope.simeval`)
and the demo all drive this one object, so what ``sim-eval`` measures is what a live hub does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuscope.alert.engine import AlertChange, AlertEngine
from gpuscope.alert.topology import placements
from gpuscope.counters import Counters
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.settings import WARMUP_S
from gpuscope.ingest.overload import OverloadMonitor
from gpuscope.model import Alert, Batch
from gpuscope.productivity import ProductivityModel
from gpuscope.store.base import AppendResult, Store

AlertListener = Callable[[AlertChange], None]
#: how long a resumed alert may go unconfirmed by the warmed-up detectors before it can resolve
RESUME_GRACE_S = 30.0
_ALL = 1_000_000


class Hub:
    """Stores every accepted batch durably, feeds the detectors, and keeps alerts current."""

    def __init__(
        self, store: Store, *, price_per_gpu_hour: float = 2.5, counters: Counters | None = None
    ) -> None:
        self.store = store
        self.counters = counters or Counters()
        self.detection = DetectionEngine()
        #: the hub's own ingest lag: admission and shedding of ingest requests, ``hub_overloaded``
        self.overload = OverloadMonitor()
        self.alerts = AlertEngine(
            price_per_gpu_hour=price_per_gpu_hour, places=lambda entity: placements(self.store, entity)
        )
        #: every GPU-second's state, cause and owner (the one model all pages read)
        self.productivity = ProductivityModel(price_per_gpu_hour)
        self._detect_lock = threading.Lock()
        self._listeners: list[AlertListener] = []
        self._observers: list[Callable[[Batch], None]] = []
        #: CPU-side wall time spent in the detectors, for the hub's own /metrics
        self.detect_seconds = 0.0

    def add_listener(self, listener: AlertListener) -> None:
        """Called for every alert that fires or resolves (terminal view, notifiers)."""
        self._listeners.append(listener)

    def add_observer(self, observer: Callable[[Batch], None]) -> None:
        """Called with every newly stored batch, after the detectors (quality monitor, lineage)."""
        self._observers.append(observer)

    def ingest(self, batch: Batch) -> AppendResult:
        """Store a batch (durable on return), then let the detectors see it.

        Storing comes first: a batch is acknowledged only once it cannot be lost, and a batch
        the store de-duplicates (a retry after a lost reply) is not seen twice by detectors.
        """
        result = self.store.append(batch)
        if result.duplicate:
            self.counters.inc("ingest_duplicate_batches")
            return result
        self.counters.inc("ingest_batches")
        self.counters.inc("ingest_samples", result.samples)
        self.counters.inc("ingest_events", result.events)
        self.counters.inc("ingest_training_records", result.training)
        self.counters.inc("ingest_refused_samples", result.refused_samples)
        self.detect(batch)
        self.productivity.observe(batch)
        for observer in self._observers:
            observer(batch)
        return result

    def detect(self, batch: Batch) -> None:
        """Let the detectors see a stored batch (a sharded hub routes it to the owners instead)."""
        with self._detect_lock:
            started = time.perf_counter()
            self.detection.observe(batch)
            self.detect_seconds += time.perf_counter() - started

    def warm_up(
        self,
        now: float,
        window: float = WARMUP_S,
        nodes: Iterable[str] | None = None,
        jobs: Iterable[str] | None = None,
    ) -> int:
        """Feed the detectors what the store holds of the last ``window`` seconds (only the given
        nodes/jobs when named), so that history, baselines and silences are known at once. Only the
        detectors see it: nothing is stored again and no observer runs. Returns batches replayed."""
        if window <= 0:
            return 0
        replayed = 0
        with self._detect_lock:
            for batch in self.store.replay(now - window, now, nodes, jobs):
                self.detection.observe(batch)
                replayed += 1
            self.detection.replayed(now)  # senders silent before now stay silent from their last report
        self.counters.inc("warmup_batches", replayed)
        return replayed

    def resume(self, now: float, window: float = WARMUP_S) -> None:
        """At start: continue the alerts that were firing when the hub stopped (without notifying
        them again, and with new alert ids after the stored ones), then warm the detectors up."""
        stored = self.store.alerts(limit=_ALL)
        numbers = [int(a.id[3:]) for a in stored if a.id.startswith("al-") and a.id[3:].isdecimal()]
        firing = [a for a in stored if a.firing]
        with self._detect_lock:
            adopted = self.alerts.adopt(firing, now, RESUME_GRACE_S)
            self.alerts.id_offset = max(numbers, default=0) - len(self.alerts.all())
        self.counters.inc("alerts_resumed", adopted)
        self.productivity.load(self.store, now)
        self.warm_up(now, window)

    def evaluate(self, now: float) -> list[AlertChange]:
        """Run every detector at ``now`` and apply the findings to the alert state."""
        findings = self.overload.findings(now)
        with self._detect_lock:
            self.detection.hub_behind(now, bool(findings))
            findings += self.detection.evaluate(now)
            changes = self.alerts.update(now, findings)
            firing = list(self.alerts.firing())
        self.productivity.advance(now, firing)
        for change in changes:
            self.store.save_alert(change.alert)
        self._tell(changes)
        return changes

    def _tell(self, changes: list[AlertChange]) -> None:
        """Every listener hears every change, on a single hub and on a cluster member alike."""
        for change in changes:
            for listener in self._listeners:
                listener(change)

    def maintain(self, now: float) -> None:
        """Periodic store upkeep: the productivity model's GPU time, rollups and raw retention."""
        try:
            self.productivity.save(self.store, now)
        finally:  # telemetry upkeep runs whether or not the GPU time could be saved
            self.store.rollup(now)
            self.store.compact(now)

    def incidents(self) -> list[dict[str, Any]]:
        with self._detect_lock:
            return [incident.to_dict() for incident in self.alerts.incidents()]

    def detection_stats(self) -> dict[str, int]:
        """What the detectors refused or withheld (bad input, verdicts held back during hub gaps)."""
        with self._detect_lock:
            return self.detection.stats()

    def firing(self) -> list[Alert]:
        with self._detect_lock:
            return list(self.alerts.firing())
