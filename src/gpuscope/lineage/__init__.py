"""Lineage: which training run and checkpoint each served model version came from (see ``registry``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.lineage.registry import LineageError, LineageRegistry, Sql, lineage_path
from gpuscope.model import Batch, Event

if TYPE_CHECKING:
    from gpuscope.hub import Hub

__all__ = ["LineageError", "LineageRegistry", "for_hub", "lineage_path", "register_checkpoints"]


def register_checkpoints(registry: LineageRegistry, batch: Batch) -> int:
    """Record in lineage every checkpoint a run reported saved (``run.save()`` and friends): rank
    0's ``checkpoint_completed`` with its ``manifest_hash``. Returns how many were recorded."""
    added = 0
    for event in batch.events:
        data, labels = event.data, event.labels
        if event.kind != "checkpoint_completed" or labels.get("rank", "0") != "0":
            continue
        step = data.get("step")
        if "job" not in labels or "manifest_hash" not in data or not isinstance(step, int):
            continue
        try:
            registry.add_checkpoint(
                labels["job"], step, data["manifest_hash"], str(data.get("path", "")), at=event.ts
            )
        except LineageError:
            continue  # a malformed report: the checkpoint can still be registered by hand
        added += 1
    return added


def for_hub(hub: Hub, con: Sql | None = None) -> LineageRegistry:
    """The registry whose events (registrations, promotions) ``hub`` ingests: beside its store, or
    on ``con`` (sharded hubs share one registry in PostgreSQL; the runtime hands it in). It records
    the checkpoints runs report saved as they arrive."""
    registry = _open_for(hub, con)
    hub.add_observer(
        lambda batch: hub.counters.inc(
            "lineage_checkpoints_registered", register_checkpoints(registry, batch)
        )
    )
    return registry


def _open_for(hub: Hub, con: Sql | None) -> LineageRegistry:

    def emit(events: list[Event]) -> None:
        hub.ingest(Batch("lineage", events=events))

    if con is not None:
        return LineageRegistry(emit=emit, con=con)
    return LineageRegistry(lineage_path(str(getattr(hub.store, "path", ":memory:"))), emit=emit)
