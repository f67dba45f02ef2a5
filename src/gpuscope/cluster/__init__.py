"""Sharded hubs: several hub processes share one cluster, with shared state in PostgreSQL.

Agents and SDKs may send to any hub. Detection for each node, job and service is owned by exactly
one live hub at a time (rendezvous hashing over the live members, enforced by one PostgreSQL
advisory lock per shard); alerts, their notifications and membership live in PostgreSQL, so every
hub answers the same. A hub that dies loses its locks with its connection, and the survivors take
its shards over, continuing its firing alerts. Silences, acknowledgements, alert history and the
lineage registry run their single-hub code on PostgreSQL (:mod:`.sql`); incidents are grouped over
the shared alerts; notification timing is kept in the shared outbox (:mod:`.notify`). See
:mod:`.membership`, :mod:`.state`, :mod:`.outbox` and :mod:`.hub`.
"""

from __future__ import annotations

from gpuscope.cluster.config import ClusterConfig, parse_cluster
from gpuscope.config import HubConfig
from gpuscope.hub import Hub
from gpuscope.store.base import Store

__all__ = ["ClusterConfig", "build_hub", "join_cluster", "parse_cluster"]


def build_hub(store: Store, cfg: HubConfig) -> Hub:
    """A plain hub, or a cluster member when the config has a ``cluster:`` section."""
    cluster = parse_cluster(cfg.raw, cfg.host, cfg.port)
    if cluster is None:
        return Hub(store, price_per_gpu_hour=cfg.price_per_gpu_hour)
    from gpuscope.cluster.hub import ClusterHub

    return ClusterHub(store, cluster, price_per_gpu_hour=cfg.price_per_gpu_hour)


def join_cluster(hub: Hub) -> None:
    """Join the cluster once the hub's services are attached (a plain hub: nothing to do)."""
    from gpuscope.cluster.hub import ClusterHub

    if isinstance(hub, ClusterHub):
        hub.join()
