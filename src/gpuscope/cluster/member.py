"""One hub as a member of a sharded cluster: the backends of its seams and their life.

The :class:`~gpuscope.hub.Hub` is the same as a single hub's; it gets a
:class:`~.placement.ShardPlacement` (detect what this hub owns, forward the rest) and a
:class:`~.state.PgAlertState` (alert transitions in PostgreSQL, shared by every member). The
member joins and leaves the cluster, continues the firing alerts of the shards it takes over
(warming its detectors up for them from its store) and forgets, without resolving, the alerts of
shards it lets go. Its alerting service dispatches the alerts of the shards it owns, through the
cluster's outbox (:class:`~.outbox.PgOutbox`, also the ledger of what was sent).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpuscope.agent.route import FAILOVER_S
from gpuscope.alert.service import AlertingService
from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.forward import Forwarder
from gpuscope.cluster.membership import ClusterNode
from gpuscope.cluster.outbox import PgOutbox
from gpuscope.cluster.placement import ShardPlacement
from gpuscope.cluster.ring import entity_shard, shard_of
from gpuscope.cluster.sql import PgSql
from gpuscope.cluster.state import PgAlertState
from gpuscope.counters import Counters
from gpuscope.hub import Hub
from gpuscope.model import Batch, Labels

log = logging.getLogger("gpuscope.cluster")
_EVENTS = 1_000_000  # events of one warm-up window read for their node and job names
#: how far back a hub taking shards over looks for resolved alerts whose changes their last owner
#: had not told (its triage queue waits at most 30 s, a resolution its group's ``group_interval``)
RESOLVED_OWED_S = 3600.0


class ClusterMember:
    """Built before its hub (the hub takes :attr:`placement` and :attr:`state`), then
    :meth:`attach`-ed to it; :meth:`join` / :meth:`leave`."""

    def __init__(self, cfg: ClusterConfig, counters: Counters) -> None:
        self.cfg = cfg
        self.counters = counters
        self.node = ClusterNode(cfg, on_acquire=self._acquired, on_release=self._released, counters=counters)
        self.state = PgAlertState(self.node)
        self.placement = ShardPlacement(self.node, counters)
        self.forwarder = Forwarder(cfg, lambda hub: self.node.members.get(hub), self.route, counters)
        self.placement.forwarder = self.forwarder
        #: how long a taken-over alert waits for this hub's detectors before it may resolve
        self.takeover_grace = 2 * cfg.lease_s
        #: how long silence verdicts on the senders of shards this hub takes are held: survivors
        #: see a dead member within a renewal, its senders find a live hub within FAILOVER_S, and a
        #: batch reaching a hub that does not own its shard yet is routed again after a renewal
        self.failover_grace = 2 * cfg.renew_s + FAILOVER_S
        #: where notifications wait, delivered by any member, and the ledger of what was sent
        self.outbox = PgOutbox(cfg.postgres_dsn, cfg.hub_id, counters)
        self.alerting: AlertingService | None = None
        self._hub: Hub | None = None
        self._state_db: PgSql | None = None
        self._joined = False

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise RuntimeError("the cluster member has no hub yet (attach it first)")
        return self._hub

    def attach(self, hub: Hub) -> None:
        self._hub = hub
        hub.alerts.continue_grace = self.takeover_grace

    def use_alerting(self, service: AlertingService) -> None:
        """``service`` dispatches the alerts this member takes over, and forgets those it lets go."""
        self.alerting = service

    def state_db(self) -> PgSql:
        """The alert layer's state (silences, acknowledgements, history) in the cluster's database."""
        if self._state_db is None:
            self._state_db = PgSql(self.cfg.postgres_dsn, self.counters)
        return self._state_db

    # -- life ---------------------------------------------------------------------------------

    def join(self) -> None:
        """Join the cluster: take shards, and forward parts owned by peers."""
        self.node.join()
        self.forwarder.start()
        self._joined = True

    def leave(self) -> None:
        """Hand the shards over at once (survivors need not wait for the lease), then close."""
        if not self._joined:
            return
        self._joined = False
        self.forwarder.stop()
        self.node.leave()
        self.state.close()
        self.outbox.close()

    # -- ownership changes (called by the node, under its lock) --------------------------------

    def _acquired(self, shards: set[int]) -> None:
        hub = self.hub
        now = time.time()
        alerts = self.state.firing_in(shards)
        n = hub.continue_alerts(alerts, now, self.takeover_grace)
        self.counters.inc("cluster_alerts_adopted", n)
        if self.alerting is not None:
            self.alerting.continued(alerts)
            resolved = self.state.resolved_in(shards, now - RESOLVED_OWED_S)
            self.counters.inc("cluster_resolutions_continued", self.alerting.continued_resolved(resolved))
        window = self.placement.warmup_s
        nodes, jobs = self._keys_in(shards, now, window)
        replayed = hub.warm_up(now, window, nodes, jobs) if nodes or jobs else 0
        if self._joined:  # taken from a member that died or left, or given up to this one
            taken = frozenset(shards)
            until = time.time() + self.failover_grace
            hub.gaps.hold(lambda entity: entity_shard(entity, self.cfg.shards) in taken, until)
        log.info(
            "took %d shards, continuing %d firing alerts, %d batches replayed for %d nodes, %d jobs",
            *(len(shards), n, replayed, len(nodes), len(jobs)),
        )

    def _keys_in(self, shards: set[int], now: float, window: float) -> tuple[set[str], set[str]]:
        """The nodes and jobs the store saw in the warm-up window that fall in ``shards``: entities
        of the telemetry snapshot and labels of events (heartbeats, job events, XIDs)."""
        if window <= 0:
            return set(), set()
        store = self.hub.store
        seen = [row["labels"] for row in store.snapshot(max_age=window)]
        seen += [e.labels for e in store.events(now - window, now, limit=_EVENTS)]
        keys: dict[str, set[str]] = {"node": set(), "job": set()}
        for labels in seen:
            for kind, names in keys.items():
                name = labels.get(kind)
                if name is not None and shard_of(kind, name, self.cfg.shards) in shards:
                    names.add(name)
        return keys["node"], keys["job"]

    def _released(self, shards: set[int]) -> None:
        def gone(entity: Labels) -> bool:
            return entity_shard(entity, self.cfg.shards) in shards

        n = self.hub.forget_alerts(gone)
        if self.alerting is not None:
            self.alerting.forget(gone)
        log.info("let go of %d shards and %d firing alerts", len(shards), n)

    # -- data path and status -----------------------------------------------------------------

    def route(self, batch: Batch, hops: int) -> dict[str, int]:
        """A part a peer forwarded (or one coming back after its owner moved): route it again."""
        return self.route_many([batch], hops)

    def route_many(self, batches: list[Batch], hops: int) -> dict[str, int]:
        """The parts of one forward request, routed again in order; this hub's detectors see
        theirs in one pass (:meth:`Hub.observe_local_many`)."""
        local: list[Batch] = []
        counts = {"observed": 0, "forwarded": 0}
        for batch in batches:
            for key, n in self.placement.route(batch, hops, local.append).items():
                counts[key] = counts.get(key, 0) + n
        self.hub.observe_local_many(local)
        return counts

    def status(self) -> dict[str, Any]:
        status = self.node.status()
        status["forward"] = self.forwarder.stats()
        return status
