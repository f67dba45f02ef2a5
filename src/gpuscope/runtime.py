"""The one composition root: a :class:`~gpuscope.config.HubConfig` in, a running hub out.

``gpuscope hub``, ``gpuscope demo``, the benchmarks and the tests that run a whole hub build it
here with :func:`assemble`, so they all carry the same services (quality monitoring, alerting,
the clock, cluster membership) wired the same way. ``sim-eval`` drives the :class:`Hub` alone in
virtual time (:func:`evaluation_hub`): no clock thread, no notifications.

The order things start and stop in is written down in :meth:`Runtime.start` and
:meth:`Runtime.stop`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, replace
from types import FrameType

import psycopg

from gpuscope import gcpolicy, procmem
from gpuscope.alert.service import AlertingService, default_state_path
from gpuscope.cluster.member import ClusterMember
from gpuscope.cluster.sql import PgSql
from gpuscope.config import HubConfig
from gpuscope.counters import Counters
from gpuscope.evaluator import Evaluator
from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits
from gpuscope.lineage import LineageRegistry, for_hub
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.slo import Slo
from gpuscope.store.base import Store
from gpuscope.store.duckdb.store import DuckDBStore
from gpuscope.store.errors import StoreError
from gpuscope.store.settings import open_store
from gpuscope.web.ingest_worker import WorkerSpec
from gpuscope.web.ingest_workers import IngestWorkers, replay_logs
from gpuscope.web.server import HubServer, is_loopback

log = logging.getLogger("gpuscope.runtime")


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class AssemblyError(RuntimeError):
    """A hub could not be put together (its cluster database refused); nothing is left open."""


def evaluation_hub(store: Store, price_per_gpu_hour: float, slos: list[Slo] | None = None) -> Hub:
    """A hub with the detection-side services only (drift and business series), for virtual time."""
    hub = Hub(store, price_per_gpu_hour=price_per_gpu_hour)
    QualityMonitor(slos or []).attach(hub)
    return hub


def keep_finished_jobs(hub: Hub, seconds: float) -> None:
    """``detection.finished_job_retention_s``: the productivity model and the detectors forget an
    ended job's state this long after it ended."""
    hub.productivity.finished_job_retention_s = seconds
    for detector in hub.detection.detectors:
        detector.keep_finished_jobs(seconds)


def _alerting(hub: Hub, cluster: ClusterMember | None, cfg: HubConfig) -> AlertingService:
    settings = cfg.alerting
    if settings.state_path is None:
        settings = replace(settings, state_path=default_state_path(cfg.storage_path))
    if settings.pending_for:
        hub.alerts.pending_for = dict(settings.pending_for)
    if cluster is not None:
        # silences, acknowledgements, history and the outbox (with what was sent) are shared by
        # every hub of the cluster
        service = AlertingService(
            hub, settings, db=cluster.state_db(), outbox=cluster.outbox, ledger=cluster.outbox
        )
        cluster.use_alerting(service)
        return service
    return AlertingService(hub, settings)


def member_hub(store: Store, member: ClusterMember, price_per_gpu_hour: float = 2.5) -> Hub:
    """One hub, cluster as backends: detection placed by shard, alert state in PostgreSQL."""
    hub = Hub(
        store,
        price_per_gpu_hour=price_per_gpu_hour,
        counters=member.counters,
        placement=member.placement,
        state=member.state,
    )
    member.attach(hub)
    return hub


@dataclass(slots=True)
class Runtime:
    """A hub and what runs around it; :meth:`start` / :meth:`stop` (or :meth:`run`)."""

    cfg: HubConfig
    hub: Hub
    cluster: ClusterMember | None  # the hub's cluster backends, when it is a member of a cluster
    quality: QualityMonitor
    alerting: AlertingService
    lineage: LineageRegistry
    evaluator: Evaluator | None  # None: the caller evaluates (virtual time)
    server: HubServer | None
    #: processes serving the ingest route (``hub.ingest_workers``), None when the server does
    workers: IngestWorkers | None = None

    def start(self, now: float | None = None) -> None:
        """Start everything; with a server, it accepts connections when this returns."""
        self._start_services(now)
        # 4. HTTP: senders' data flows in from here on (with ingest workers: they accept, and
        #    hand the server every connection that is not theirs)
        if self.server is not None:
            self.server.start()
        if self.workers is not None:
            self.workers.start()
        self._join()

    def run(self) -> None:
        """``gpuscope hub``: serve in this thread until SIGINT/SIGTERM, then stop in order."""
        assert self.server is not None
        self._start_services(None)
        self._join()  # 4 and 5 swap: serving blocks this thread until the hub is told to stop
        # what start-up built lives as long as the process: the collector stops scanning it
        gcpolicy.tune_for_serving()
        if threading.current_thread() is threading.main_thread():
            # uvicorn, once it has stopped serving on SIGTERM, raises the signal again with the
            # handler found before it: by default that ended the process there, before the stop
            # below (ingest workers left running, the store not closed). This one ends it after.
            signal.signal(signal.SIGTERM, _terminated)
        try:
            # the workers accept from here; what they hand over waits for the server's loop
            if self.workers is not None:
                self.workers.start()
            self.server.run()
        finally:
            self._stop_workers()
            self._stop_services()

    def _start_services(self, now: float | None) -> None:
        # 0. what ingest workers acknowledged before the last stop and the store does not hold
        #    yet goes in now (the store replayed its own log as it opened), before the warm-up
        if self.workers is not None:
            self.workers.replay()
        elif isinstance(self.hub.store, DuckDBStore) and self.hub.store.durable:
            # workers a former setting had: what they acknowledged is not left behind
            replayed, _ = replay_logs(self.hub.store)
            self.hub.counters.inc("store.log_replayed_batches", replayed)
        # 1. continue the alerts that were firing and warm the detectors up from the store, before
        #    any new data arrives (a hub that cannot read its history still serves, warming up live)
        try:
            self.hub.resume(time.time() if now is None else now, self.cfg.warmup_s)
        except StoreError as exc:
            log.warning("warm-up skipped: %s", exc)
        # 2. alerting (its outbox, its triage worker and its clock), so the first changes are
        #    triaged, routed and delivered
        self.alerting.start()
        # 3. the hub's clock: detectors evaluated every second, store upkeep every minute
        if self.evaluator is not None:
            self.evaluator.start()

    def _join(self) -> None:
        # 5. a cluster member takes its shards last (each taken shard is warmed up by itself)
        if self.cluster is not None:
            self.cluster.join()

    def stop(self) -> None:
        """Stop in the reverse order of :meth:`start`."""
        # 1. no new data: requests under way finish (or are dropped unacknowledged after 10 s);
        #    ingest workers first, then everything they acknowledged goes into the store
        self._stop_workers()
        if self.server is not None:
            self.server.stop()
        self._stop_services()

    def _stop_workers(self) -> None:
        if self.workers is not None:
            self.workers.stop()

    def _stop_services(self) -> None:
        # 2. the clock stops: no evaluation starts after this
        if self.evaluator is not None:
            self.evaluator.stop()
        # the observers see what was acknowledged since the last evaluation (lineage registers its
        # checkpoints; what the quality monitor derives from it is stored, and seen in turn)
        self.hub.settle()
        # 3. alerting: what fired is triaged and dispatched into the outbox (bounded time, the
        #    rest without playbooks), then its clock and outbox stop, its state database closes
        self.alerting.stop()
        # 4. the GPU time counted since the last upkeep is kept
        try:
            self.hub.productivity.save(self.hub.store)
        except StoreError as exc:
            log.warning("the last minute of GPU time was not saved: %s", exc)
        # 5. a cluster member leaves, handing its shards over at once
        if self.cluster is not None:
            self.cluster.leave()
        # 6. the store flushes and closes
        self.hub.store.close()
        if self.workers is not None:
            self.workers.close()


def assemble(
    cfg: HubConfig,
    *,
    store: Store | None = None,
    serve: bool = True,
    evaluate_interval: float | None = 1.0,
    any_port: bool = False,
) -> Runtime:
    """Build (not start) the hub ``cfg`` describes: its store (unless given), the hub or cluster
    member, quality monitoring, alerting, the clock and, with ``serve``, the HTTP server on
    ``cfg.host:cfg.port`` (``any_port``: a free one when that port is taken). Without an
    ``evaluate_interval`` the hub has no clock thread: the caller evaluates in its own time.

    Raises :class:`~gpuscope.store.errors.StoreError` (a store it cannot open),
    :class:`AssemblyError` (the cluster database) and ``ValueError``/``OSError`` (the listener);
    whatever was opened is closed again first."""
    procmem.limit_arenas(cfg.malloc_arenas)  # before the store's and the server's threads start
    procmem.fix_mmap_threshold()
    store = store if store is not None else open_store(cfg.storage_settings(), cfg.store_limits())
    cluster: ClusterMember | None = None
    counters = Counters()
    try:
        if cfg.cluster is not None:
            cluster = ClusterMember(cfg.cluster, counters)
    except psycopg.Error as exc:
        store.close()
        reason = str(exc).strip()
        raise AssemblyError(f"cannot use the cluster database (cluster.postgres_dsn): {reason}") from None
    if cluster is None:
        hub = Hub(store, price_per_gpu_hour=cfg.price_per_gpu_hour, counters=counters)
    else:
        hub = member_hub(store, cluster, cfg.price_per_gpu_hour)
    keep_finished_jobs(hub, cfg.finished_job_retention_s)
    quality = QualityMonitor(cfg.slos)
    quality.attach(hub)
    alerting = _alerting(hub, cluster, cfg)
    server = None
    # sharded hubs share one lineage registry in PostgreSQL; a single hub keeps it beside its store
    lineage = for_hub(hub, PgSql(cluster.cfg.postgres_dsn, cluster.counters) if cluster is not None else None)
    if serve:
        try:
            server = _server(hub, cluster, lineage, cfg, alerting, cfg.port)
        except OSError:
            if not any_port:
                alerting.stop()
                store.close()
                raise
            server = _server(hub, cluster, lineage, cfg, alerting, 0)
        except ValueError:
            alerting.stop()
            store.close()
            raise
    workers: IngestWorkers | None = None
    if server is not None and cfg.ingest_workers:
        made = _workers(hub, store, server, cfg)
        if isinstance(made, str):
            alerting.stop()
            store.close()
            raise AssemblyError(made)
        workers = made
    evaluator = Evaluator(hub, evaluate_interval) if evaluate_interval is not None else None
    return Runtime(cfg, hub, cluster, quality, alerting, lineage, evaluator, server, workers)


def _workers(hub: Hub, store: Store, server: HubServer, cfg: HubConfig) -> IngestWorkers | str:
    """The hub's ingest workers (``hub.ingest_workers``), or why it cannot have them."""
    why = None
    if not isinstance(store, DuckDBStore) or not store.durable:
        why = "needs the DuckDB store on a file (its workers' logs live beside it)"
    elif cfg.tls is not None:
        why = "cannot hand TLS connections between processes; terminate TLS in front of the hub"
    elif cfg.cluster is not None:
        why = "is not supported on a cluster member"
    if why is not None:
        return f"hub.ingest_workers: {why}"
    assert isinstance(store, DuckDBStore)
    spec = WorkerSpec(
        index=0,
        log_dir="",
        held=0,
        auth=cfg.auth,
        limits=Limits(max_body_bytes=cfg.max_body_bytes, max_past_s=cfg.raw_retention_s),
        overload=hub.overload.settings,
        open_reads=is_loopback(cfg.host),
        name=hub.overload.name,
        listen_fd=-1,
        control_fd=-1,
    )
    return IngestWorkers(hub, store, server, cfg.ingest_workers, spec)


def _server(
    hub: Hub,
    cluster: ClusterMember | None,
    lineage: LineageRegistry,
    cfg: HubConfig,
    alerting: AlertingService,
    port: int,
) -> HubServer:
    return HubServer(
        hub,
        cfg.host,
        port,
        auth=cfg.auth,
        tls=cfg.tls,
        limits=Limits(max_body_bytes=cfg.max_body_bytes, max_past_s=cfg.raw_retention_s),
        alerting=alerting,
        lineage=lineage,
        cluster=cluster,
        evaluate_interval=None,  # the runtime runs the clock, in its place in the order
        close_store=False,
        accept=not cfg.ingest_workers,  # with workers, they accept and hand the rest over
    )
