"""The services a running hub carries beside ingest and detection, attached in one place.

``gpuscope hub`` and ``gpuscope demo`` both call :func:`attach_services`, so the demo shows what a
real deployment does: notifications and triage (alerting), and model quality with error budgets.
"""

from __future__ import annotations

from dataclasses import replace

from gpuscope.alert.service import AlertingService, default_state_path
from gpuscope.cluster.hub import ClusterHub
from gpuscope.config import HubConfig
from gpuscope.hub import Hub
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.store.base import Store


def build_hub(store: Store, cfg: HubConfig) -> Hub:
    """A plain hub, or a cluster member when the config has a ``cluster:`` section."""
    if cfg.cluster is None:
        return Hub(store, price_per_gpu_hour=cfg.price_per_gpu_hour)
    return ClusterHub(store, cfg.cluster, price_per_gpu_hour=cfg.price_per_gpu_hour)


def join_cluster(hub: Hub) -> None:
    """Join the cluster once the hub's services are attached (a plain hub: nothing to do)."""
    if isinstance(hub, ClusterHub):
        hub.join()


def attach_services(hub: Hub, cfg: HubConfig) -> AlertingService:
    """Attach quality monitoring and alerting to ``hub``; the caller starts and stops alerting."""
    QualityMonitor(cfg.slos).attach(hub)
    settings = cfg.alerting
    if settings.state_path is None:
        settings = replace(settings, state_path=default_state_path(cfg.storage_path))
    if settings.pending_for:
        hub.alerts.pending_for = dict(settings.pending_for)
    # a cluster member shares silences, acknowledgements and history with every hub
    db = hub.state_db() if isinstance(hub, ClusterHub) else None
    return AlertingService(hub, settings, db=db)
