"""The hub's core: ingest → store → detect → alert, independent of HTTP and of the clock.

The HTTP server (:mod:`gpuscope.web.api`), the virtual-time evaluation (:mod:`gpuscope.simeval`)
and the demo all drive this one object, so what ``sim-eval`` measures is what a live hub does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpuscope.alert.engine import AlertChange, AlertEngine
from gpuscope.alert.incidents import Incident
from gpuscope.alert.state import AlertState, LocalAlertState
from gpuscope.alert.topology import placements
from gpuscope.counters import Counters
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.settings import WARMUP_S
from gpuscope.gaps import SenderGaps
from gpuscope.ingest.overload import OverloadMonitor
from gpuscope.model import Alert, Batch, Labels
from gpuscope.observing import ObserveStage
from gpuscope.placement import LocalPlacement, Placement
from gpuscope.productivity import ProductivityModel
from gpuscope.store.base import AppendResult, Durable, Store

AlertListener = Callable[[AlertChange], None]
#: drains of the observe stage per evaluation: a tick, what observers derive from it, and from that
DERIVED_PASSES = 3
#: how long a resumed alert may go unconfirmed by the warmed-up detectors before it can resolve
RESUME_GRACE_S = 30.0
#: batches' arrival stamps kept between two evaluations at most
MAX_HEARD = 65536


class Hub:
    """Stores every accepted batch durably, feeds the detectors, and keeps alerts current.

    Two collaborators say where things happen: ``placement``, where the detection of a batch part
    runs (here, or on the shard's owner), and ``state``, where alert transitions are recorded and
    read back (this hub's memory and store, or the cluster's PostgreSQL)."""

    def __init__(
        self,
        store: Store,
        *,
        price_per_gpu_hour: float = 2.5,
        counters: Counters | None = None,
        placement: Placement | None = None,
        state: AlertState | None = None,
    ) -> None:
        self.store = store
        self.counters = counters or Counters()
        self.placement: Placement = placement if placement is not None else LocalPlacement()
        self.detection = DetectionEngine()
        #: the hub's own ingest lag: admission and shedding of ingest requests, ``hub_overloaded``
        self.overload = OverloadMonitor()
        #: silence verdicts held where the hub (overload) or the cluster (takeover) made senders silent
        self.gaps = SenderGaps(self.counters)
        self.alerts = AlertEngine(
            price_per_gpu_hour=price_per_gpu_hour,
            places=lambda entity: placements(self.store, entity),
            state=state if state is not None else LocalAlertState(store, counters=self.counters),
        )
        #: every GPU-second's state, cause and owner (the one model all pages read)
        self.productivity = ProductivityModel(price_per_gpu_hour, counters=self.counters)
        self._detect_lock = threading.Lock()
        self._listeners: list[AlertListener] = []
        #: CPU-side wall time spent in the detectors, for the hub's own /metrics
        self.detect_seconds = 0.0
        #: acknowledged batches waiting for the detectors and observers, seen a tick at once
        self.observing = ObserveStage(self.counters)
        self.observing.add("detection", self._detect_tick)
        self.observing.add("arrivals", self._arrivals)
        #: (sender, its latest timestamp) of each batch observed since the last evaluation; an
        #: authorised read drains the observe stage on a web thread while the evaluator swaps it
        self._heard: list[tuple[str, float]] = []
        self._heard_lock = threading.Lock()
        self.observing.add_each("productivity", self.productivity.observe)

    def structures(self) -> dict[str, object]:
        """The hub's in-memory state by name, each meant to stay bounded (sizes in ``/metrics``)."""
        parts: dict[str, object] = {
            "observe_stage": self.observing,
            "alert_engine": self.alerts,
            "alert_state": self.alerts.state,
            "sender_gaps": self.gaps,
            "productivity": self.productivity,
            "overload": self.overload,
        }
        for detector in self.detection.detectors:
            parts[f"detector.{type(detector).__name__}"] = detector
        return parts

    def add_listener(self, listener: AlertListener) -> None:
        """Called for every alert that fires or resolves (terminal view, notifiers)."""
        self._listeners.append(listener)

    def add_observer(self, observer: Callable[[Batch], None]) -> None:
        """Called with every newly stored batch, after the detectors (quality monitor, lineage),
        in the order they were stored, from the observe stage (by the next evaluation at the latest)."""
        module = getattr(observer, "__module__", None) or "observer"  # e.g. observe_errors_lineage
        self.observing.add_each(module.rsplit(".", 1)[-1], observer)

    def ingest(self, batch: Batch) -> AppendResult:
        """Store a batch (durable on return) and queue it for the detectors and observers.

        Storing comes first: a batch is acknowledged only once it cannot be lost, and a batch
        the store de-duplicates (a retry after a lost reply) is not seen twice by detectors. They
        see it in the observe stage, a tick at once, before the next evaluation.
        """
        result = self.store.append(batch)
        self._stored(batch, result)
        return result

    def ingest_then(self, batch: Batch, durable: Durable) -> bool:
        """:meth:`ingest` for a caller that must not wait (the event loop), where the store can
        (:meth:`Store.append_then`): False when it cannot, and nothing was done. Refusals found at
        once are raised; ``durable`` hears the result once the batch is durable and queued for the
        detectors, or the store's error (from the store's thread; it must not block)."""

        def stored(outcome: AppendResult | Exception) -> None:
            if isinstance(outcome, AppendResult):
                self._stored(batch, outcome)
            durable(outcome)

        return self.store.append_then(batch, stored)

    def owner_url(self, batch: Batch) -> str | None:
        """The hub that decides the batch's sender (a cluster member names it; None: this one)."""
        return self.placement.owner_url(batch)

    def _stored(self, batch: Batch, result: AppendResult) -> None:
        """A batch is durable: count it and queue it for the detectors and observers."""
        if result.duplicate:
            self.counters.inc("ingest_duplicate_batches")
            return
        self.counters.inc("ingest_batches")
        self.counters.inc("ingest_samples", result.samples)
        self.counters.inc("ingest_events", result.events)
        self.counters.inc("ingest_training_records", result.training)
        self.counters.inc("ingest_refused_samples", result.refused_samples)
        batch.wire = None  # stored: the observers read the batch, not the frame it came in
        self.observing.put(batch)

    def taken(self, batch: Batch, result: AppendResult) -> None:
        """A batch an ingest worker made durable and the store took from its log
        (:mod:`gpuscope.web.ingest_workers`): counted and queued for the detectors and observers
        as :meth:`ingest` does."""
        self._stored(batch, result)

    def unsettled(self) -> bool:
        """Whether acknowledged batches wait for the observe stage (cheap: no observer runs)."""
        return self.observing.backlog()[0] > 0

    def settle(self) -> int:
        """Let the detectors and observers see every batch acknowledged so far, and what the
        observers derive from them and store meanwhile (the quality monitor's series, lineage's
        events), as when each request observed its own batch; returns how many. The one call of
        every reader that must not lag an acknowledgement: the evaluation first, an authorised GET
        (:mod:`gpuscope.web.settle`), the runtime as it stops."""
        total = 0
        for _ in range(DERIVED_PASSES):
            seen = self.observing.drain()
            total += seen
            if not seen:
                break
        return total

    def _detect_tick(self, batches: list[Batch]) -> None:
        """One tick's batches: this hub's parts all at once, the others to their owners."""
        parts: list[Batch] = []
        for batch in batches:
            self.placement.observe(batch, parts.append)
        with self._detect_lock:
            started = time.perf_counter()
            self.detection.observe_many(parts)
            self.detect_seconds += time.perf_counter() - started

    def _arrivals(self, batches: list[Batch]) -> None:
        """How late each sender's data reaches the detectors: the overload monitor's arrival lag."""
        arrived = []
        for batch in batches:
            stamps = [f.ts for f in batch.frames] + [r.ts for r in batch.training]
            if stamps:
                arrived.append((batch.source, max(stamps)))
        with self._heard_lock:
            room = max(0, MAX_HEARD - len(self._heard))  # bounded should no evaluation come
            self._heard += arrived[:room]
        if len(arrived) > room:
            self.counters.inc("arrival_stamps_dropped", len(arrived) - room)

    def observe_local(self, batch: Batch) -> None:
        """This hub's detectors see a batch (part) that is theirs (a peer's forward, at once)."""
        self.observe_local_many([batch])

    def observe_local_many(self, batches: list[Batch]) -> None:
        """:meth:`observe_local` of several parts, in order, at once (the parts of one forward
        request: the GPU table takes their rows in one scatter, as it takes a tick's)."""
        if not batches:
            return
        with self._detect_lock:
            started = time.perf_counter()
            self.detection.observe_many(batches)
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
        with self._detect_lock:
            adopted = self.alerts.adopt(self.alerts.state.resumed(), now, RESUME_GRACE_S)
        self.counters.inc("alerts_resumed", adopted)
        self.productivity.load(self.store, now)
        self.placement.resume(now, window, self.warm_up)

    def continue_alerts(self, alerts: list[Alert], now: float, grace: float) -> int:
        """Continue alerts another hub fired (shards this hub takes over) without firing them
        again; they resolve only if absent for ``grace`` seconds more."""
        with self._detect_lock:
            return self.alerts.adopt(alerts, now, grace)

    def forget_alerts(self, gone: Callable[[Labels], bool]) -> int:
        """Forget, without resolving, the alerts of entities this hub no longer decides."""
        with self._detect_lock:
            return self.alerts.drop(gone)

    def evaluate(self, now: float) -> list[AlertChange]:
        """Run every detector at ``now`` and apply the findings this hub owns to the alert state
        (which records each transition); then every listener hears what changed. The detectors
        first see every batch acknowledged before now."""
        self.settle()
        with self._heard_lock:
            heard, self._heard = self._heard, []
        self.overload.arrived(now, heard)
        findings = self.overload.findings(now)
        cover = self.overload.cover(now)
        self.gaps.shed(cover)
        with self.placement.held(), self._detect_lock:
            self.detection.hear_wire(cover.wire)
            owned = [f for f in self.detection.evaluate(now) if self.placement.owns(f.entity)]
            findings += self.gaps.apply(owned, now, self.alerts.firing)
            changes = self.alerts.update(now, findings)
            firing = list(self.alerts.firing())
        self.productivity.advance(now, firing)
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

    def save_alert(self, alert: Alert) -> None:
        """Keep what the alert layer attached to an alert (playbook results, acknowledgement)."""
        self.alerts.state.save(alert)

    def attach(self, alert: Alert, key: str, value: Any) -> None:
        """Attach what the alert layer found out (a playbook's answers) to an alert, and keep it."""
        self.attach_all([(alert, key, value)])

    def attach_all(self, attached: Sequence[tuple[Alert, str, Any]]) -> None:
        """Attach (alert, key, value) for each, and keep them in one write where the alert state
        allows. Between evaluations: an evaluation rebuilds a firing alert's details and saves a
        resolution, and neither may cross this."""
        with self._detect_lock, self.alerts.state.batch():
            for alert, key, value in attached:
                alert.details[key] = value
                self.alerts.state.save(alert)

    def alert_view(self) -> tuple[list[Alert], list[Incident]]:
        """Every alert in the order they fired, and their incidents (a cluster's: all members')."""
        return self.alerts.state.view()

    def stored_alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        """Stored alerts, newest start first (a cluster member's: the whole cluster's)."""
        return self.alerts.state.alerts(firing_only, limit)

    def incidents(self) -> list[dict[str, Any]]:
        return [incident.to_dict() for incident in self.alert_view()[1]]

    def detection_stats(self) -> dict[str, int]:
        """What the detectors refused or withheld (bad input, verdicts held back during hub gaps)."""
        with self._detect_lock:
            return self.detection.stats()

    def firing(self) -> list[Alert]:
        """Every firing alert (on a cluster member: the cluster's, whichever member owns it)."""
        return [alert for alert in self.alert_view()[0] if alert.firing]
