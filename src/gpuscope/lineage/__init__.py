"""Lineage: which training run and checkpoint each served model version came from (see ``registry``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.lineage.registry import LineageError, LineageRegistry, Sql, lineage_path
from gpuscope.model import Batch, Event

if TYPE_CHECKING:
    from gpuscope.hub import Hub

__all__ = ["LineageError", "LineageRegistry", "for_hub", "lineage_path"]


def for_hub(hub: Hub, con: Sql | None = None) -> LineageRegistry:
    """The registry whose events (registrations, promotions) ``hub`` ingests: beside its store, or
    on ``con`` (sharded hubs share one registry in PostgreSQL; the runtime hands it in)."""

    def emit(events: list[Event]) -> None:
        hub.ingest(Batch("lineage", events=events))

    if con is not None:
        return LineageRegistry(emit=emit, con=con)
    return LineageRegistry(lineage_path(str(getattr(hub.store, "path", ":memory:"))), emit=emit)
