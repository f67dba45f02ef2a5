"""A hub that is one member of a sharded cluster (see :mod:`gpuscope.cluster`).

It stores what it receives like any hub, then hands each part of a batch to the detectors of the
hub owning that part's shard: its own, or a peer's over the internal observe endpoint. It applies
only findings on shards it owns (it holds their locks), writes every alert transition and its
notifications to PostgreSQL in one transaction, continues the firing alerts of shards it takes
over instead of firing them again, and forgets (without resolving) the alerts of shards it lets go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuscope.alert.engine import AlertChange, AlertEngine
from gpuscope.alert.incidents import Incident
from gpuscope.alert.service import AlertingService
from gpuscope.alert.topology import placements
from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.forward import Forwarder
from gpuscope.cluster.membership import ClusterNode
from gpuscope.cluster.notify import Note, Sweeper, render
from gpuscope.cluster.outbox import ClusterOutbox
from gpuscope.cluster.ring import data_shards, entity_shard, shard_of
from gpuscope.cluster.route import split
from gpuscope.cluster.sql import PgSql
from gpuscope.cluster.state import ClusterState
from gpuscope.counters import Counters
from gpuscope.detect.settings import WARMUP_S
from gpuscope.hub import Hub
from gpuscope.model import Alert, Batch, Event, Labels, TrainingRecord
from gpuscope.store.base import AppendResult, GpuTime, SeriesPoint, Store

log = logging.getLogger("gpuscope.cluster")
_EVENTS = 1_000_000  # events of one warm-up window read for their node and job names

LOCAL = ""
#: how many times a part may be passed on between hubs while ownership moves
MAX_HOPS = 2


class ClusterAlertEngine(AlertEngine):
    """The alert engine of one member: cluster-wide ids, and alerts that move with their shards.

    It decides transitions for the shards this hub owns from its own memory, but answers every
    question about alerts and incidents (``all``, ``get``, ``incidents``) from PostgreSQL, so the
    alerting API, acknowledgements and playbooks see the whole cluster, the same on every hub."""

    def __init__(self, state: ClusterState, **kw: Any) -> None:
        super().__init__(**kw)
        self.state = state
        state.incident_window = self._incidents.window
        state.reopen_within = self._incidents.reopen_within
        #: where each alert fired here runs, until its transition is written with it
        self.placed: dict[str, list[Labels] | None] = {}

    def next_id(self) -> str:
        return self.state.next_id()

    def places_of(self, alert: Alert) -> list[Labels] | None:
        places = super().places_of(alert)
        self.placed[alert.id] = places
        return places

    def all(self) -> list[Alert]:
        return self.state.view()[0]

    def get(self, alert_id: str) -> Alert | None:
        return next((a for a in self.all() if a.id == alert_id), None)

    def incidents(self) -> list[Incident]:
        return self.state.view()[1]

    def replace(self, mine: Alert, theirs: Alert, now: float, grace: float) -> None:
        """Another hub already fires this alert: continue theirs instead of the one just fired."""
        key = (mine.rule, tuple(sorted(mine.entity.items())))
        self._active.pop(key, None)
        self._alerts = [a for a in self._alerts if a is not mine]
        self.adopt([theirs], now, grace)

    def drop(self, shards: set[int]) -> int:
        """Forget the alerts of shards this hub no longer owns; their new owner continues them."""
        gone = [k for k, a in self._active.items() if self.state.shard(a) in shards]
        for key in gone:
            del self._active[key]
        for key in [k for k in self._pending if entity_shard(dict(k[1]), self.state.shards) in shards]:
            del self._pending[key]
        return len(gone)


class ClusterStore:
    """The hub's own store for telemetry; alerts live in PostgreSQL, shared by every hub."""

    def __init__(self, inner: Store, state: ClusterState, on_close: Any) -> None:
        self.inner = inner
        self.state = state
        self.on_close = on_close
        self.path = getattr(inner, "path", ":memory:")

    def append(self, batch: Batch) -> AppendResult:
        return self.inner.append(batch)

    def series(
        self, metric: str, labels: Labels, start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]:
        return self.inner.series(metric, labels, start, end, points)

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        return self.inner.snapshot(metrics, max_age)

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        return self.inner.aggregate(metric, by, start, end)

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        return self.inner.events(start, end, kind, labels, limit)

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]:
        return self.inner.training(job, start, end, rank, limit)

    def replay(
        self,
        start: float,
        end: float,
        nodes: Iterable[str] | None = None,
        jobs: Iterable[str] | None = None,
    ) -> Iterator[Batch]:
        return self.inner.replay(start, end, nodes, jobs)

    def save_alert(self, alert: Alert) -> None:
        self.state.save(alert)

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        return self.state.alerts(firing_only, limit)

    def save_gpu_time(self, cells: list[GpuTime]) -> None:
        self.inner.save_gpu_time(cells)

    def fold_gpu_time(self, before: float) -> int:
        return self.inner.fold_gpu_time(before)

    def gpu_time(self, start: float, end: float) -> list[GpuTime]:
        return self.inner.gpu_time(start, end)

    def rollup(self, now: float) -> dict[str, int]:
        return self.inner.rollup(now)

    def compact(self, now: float) -> dict[str, int]:
        return self.inner.compact(now)

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()

    def close(self) -> None:
        """The hub is shutting down: leave the cluster (hand shards over at once), then close."""
        try:
            self.on_close()
        finally:
            self.inner.close()


class ClusterHub(Hub):
    def __init__(
        self,
        store: Store,
        cfg: ClusterConfig,
        *,
        price_per_gpu_hour: float = 2.5,
        counters: Counters | None = None,
    ) -> None:
        counters = counters or Counters()
        self.cfg = cfg
        self.node = ClusterNode(cfg, on_acquire=self._acquired, on_release=self._released, counters=counters)
        self.state = ClusterState(self.node)
        super().__init__(
            ClusterStore(store, self.state, self.leave),
            price_per_gpu_hour=price_per_gpu_hour,
            counters=counters,
        )
        self.alerts: ClusterAlertEngine = ClusterAlertEngine(
            self.state,
            price_per_gpu_hour=price_per_gpu_hour,
            places=lambda entity: placements(self.store, entity),
        )
        #: how long a taken-over alert waits for this hub's detectors before it may resolve
        self.takeover_grace = 2 * cfg.lease_s
        #: seconds of stored history replayed to the detectors for the shards this hub takes
        self.warmup_s = WARMUP_S
        self.forwarder = Forwarder(cfg, lambda hub: self.node.members.get(hub), self.route, self.counters)
        self.outbox: ClusterOutbox | None = None
        self.sweeper: Sweeper | None = None
        self._state_db: PgSql | None = None
        self._joined = False
        #: triage, history and the routes its outbox sweep follows; set by the runtime before join
        self.alerting: AlertingService | None = None

    def state_db(self) -> PgSql:
        """The alert layer's state (silences, acknowledgements, history) in the cluster's database."""
        if self._state_db is None:
            self._state_db = PgSql(self.cfg.postgres_dsn)
        return self._state_db

    # -- life ---------------------------------------------------------------------------------

    def join(self) -> None:
        """Join the cluster and start delivering its outbox (routes and receivers from alerting)."""
        settings = self.alerting.settings if self.alerting is not None else None
        self.outbox = ClusterOutbox(
            self.cfg.postgres_dsn,
            self.cfg.hub_id,
            counters=self.counters,
            base_backoff=settings.base_backoff if settings else 1.0,
            max_backoff=settings.max_backoff if settings else 30.0,
            max_age=settings.max_age if settings else 86400.0,
        )
        self.sweeper = Sweeper(self.cfg.postgres_dsn, lambda: self.alerting, self.counters)
        self.node.join()
        self.forwarder.start()
        self.outbox.start()
        self.sweeper.start()
        self._joined = True

    def leave(self) -> None:
        if not self._joined:
            return
        self._joined = False
        self.forwarder.stop()
        if self.outbox is not None:
            self.outbox.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        self.node.leave()
        self.state.close()

    # -- ownership changes (called by the node, under its lock) --------------------------------

    def _acquired(self, shards: set[int]) -> None:
        now = time.time()
        alerts = self.state.firing_in(shards)
        with self._detect_lock:
            n = self.alerts.adopt(alerts, now, self.takeover_grace)
        self.counters.inc("cluster_alerts_adopted", n)
        nodes, jobs = self._keys_in(shards, now)
        replayed = self.warm_up(now, self.warmup_s, nodes, jobs) if nodes or jobs else 0
        log.info(
            "took %d shards, continuing %d firing alerts, %d batches replayed for %d nodes, %d jobs",
            *(len(shards), n, replayed, len(nodes), len(jobs)),
        )

    def _keys_in(self, shards: set[int], now: float) -> tuple[set[str], set[str]]:
        """The nodes and jobs the store saw in the warm-up window that fall in ``shards``: entities
        of the telemetry snapshot and labels of events (heartbeats, job events, XIDs)."""
        if self.warmup_s <= 0:
            return set(), set()
        seen = [row["labels"] for row in self.store.snapshot(max_age=self.warmup_s)]
        seen += [e.labels for e in self.store.events(now - self.warmup_s, now, limit=_EVENTS)]
        keys: dict[str, set[str]] = {"node": set(), "job": set()}
        for labels in seen:
            for kind, names in keys.items():
                name = labels.get(kind)
                if name is not None and shard_of(kind, name, self.cfg.shards) in shards:
                    names.add(name)
        return keys["node"], keys["job"]

    def resume(self, now: float, window: float = WARMUP_S) -> None:
        """Alerts continue from PostgreSQL, and detectors warm up as this hub takes its shards."""
        self.warmup_s = window

    def _released(self, shards: set[int]) -> None:
        with self._detect_lock:
            n = self.alerts.drop(shards)
        log.info("let go of %d shards and %d firing alerts", len(shards), n)

    # -- data path ----------------------------------------------------------------------------

    def _destinations(self, labels: Labels, source: str) -> set[str]:
        shards = data_shards(labels, self.cfg.shards) or {shard_of("source", source, self.cfg.shards)}
        out: set[str] = set()
        for shard in shards:
            hub = self.node.assignment.get(shard, self.cfg.hub_id)
            out.add(LOCAL if hub == self.cfg.hub_id else hub)
        return out

    def detect(self, batch: Batch) -> None:
        self.route(batch, 0)

    def route(self, batch: Batch, hops: int) -> dict[str, int]:
        """Observe this hub's parts of ``batch``, forward the others to their owners."""
        parts = split(batch, lambda labels: self._destinations(labels, batch.source))
        counts: dict[str, int] = {"observed": 0, "forwarded": 0}
        for dest, part in parts.items():
            if dest == LOCAL or hops >= MAX_HOPS:
                if dest != LOCAL:
                    self.counters.inc("cluster_forward_hops_exceeded")
                with self._detect_lock:
                    self.detection.observe(part)
                counts["observed"] += 1
            else:
                self.forwarder.send(dest, part, hops + 1)
                counts["forwarded"] += 1
        return counts

    # -- alerts -------------------------------------------------------------------------------

    def evaluate(self, now: float) -> list[AlertChange]:
        """Detect, keep the findings of owned shards, and record transitions with their notifications."""
        done: list[AlertChange] = []
        with self.node.lock, self._detect_lock:
            owned = set(self.node.owned)
            findings = [
                f for f in self.detection.evaluate(now) if entity_shard(f.entity, self.cfg.shards) in owned
            ]
            for change in self.alerts.update(now, findings):
                alert = change.alert
                if change.kind == "escalated":
                    continue  # the cluster's state records firing and resolved only
                if change.kind == "fired" and self.alerting is not None:
                    self.alerting.triage(alert)  # stored with the alert, and told to receivers
                notes = self._notifications(change, now)
                if change.kind == "fired":
                    places = self.alerts.placed.pop(alert.id, None)
                    theirs = self.state.fired(alert, notes, now, places)
                    if theirs is not None:
                        self.alerts.replace(alert, theirs, now, self.takeover_grace)
                        self.counters.inc("cluster_alerts_continued")
                        continue
                elif not self.state.resolved(alert, notes, now, self._escalation_resolved(alert, now)):
                    continue
                done.append(change)
        for change in done:
            self.counters.inc(f"cluster_alerts_{change.kind}")
            if self.alerting is not None:
                self.alerting.record(change.alert.id, change.kind, change.alert.summary)
        self._tell(done)
        return done

    def _notifications(self, change: AlertChange, now: float) -> list[Note]:
        """One notification per routed receiver for this transition, rendered now (none for an
        alert muted as it fires: the sweep tells receivers once the mute lifts)."""
        service = self.alerting
        if service is None:
            return []
        if change.kind == "fired" and service.dispatcher.mute_reason(change.alert, now) is not None:
            self.counters.inc("notifications_muted")
            return []
        return render(service, change.alert, now, self.counters)

    def _escalation_resolved(self, alert: Alert, now: float) -> Callable[[int], list[Note]]:
        service = self.alerting
        if service is None:
            return lambda _level: []
        return lambda level: render(service, alert, now, self.counters, escalation=level + 1)

    def firing(self) -> list[Alert]:
        """Every alert firing in the cluster, whichever hub owns it."""
        return self.state.alerts(firing_only=True, limit=1_000_000)

    def incidents(self) -> list[dict[str, Any]]:
        """The cluster's incidents, grouped over the shared alerts (not this hub's detectors)."""
        return [incident.to_dict() for incident in self.alerts.incidents()]

    def outbox_stats(self) -> dict[str, int]:
        """Delivered, dead and pending rows of the cluster's shared outbox (where this hub's
        notifications go; the alerting service's own outbox stays empty on a member)."""
        if self.outbox is None:
            return {"delivered": 0, "dead": 0, "pending": 0}
        return self.outbox.stats()

    def cluster_status(self) -> dict[str, Any]:
        status = self.node.status()
        status["forward"] = self.forwarder.stats()
        return status
