"""Lineage: which training run and checkpoint each served model version came from (see ``registry``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.lineage.registry import LineageError, LineageRegistry, lineage_path
from gpuscope.model import Batch, Event

if TYPE_CHECKING:
    from gpuscope.hub import Hub

__all__ = ["LineageError", "LineageRegistry", "for_hub", "lineage_path"]


def for_hub(hub: Hub) -> LineageRegistry:
    """The registry beside ``hub``'s store, whose events (registrations, promotions) the hub ingests."""

    def emit(events: list[Event]) -> None:
        hub.ingest(Batch("lineage", events=events))

    from gpuscope.cluster.hub import ClusterHub
    from gpuscope.cluster.sql import PgSql

    if isinstance(hub, ClusterHub):  # sharded hubs share one registry in PostgreSQL
        return LineageRegistry(emit=emit, con=PgSql(hub.cfg.postgres_dsn))
    return LineageRegistry(lineage_path(str(getattr(hub.store, "path", ":memory:"))), emit=emit)
