"""Where the detection of a batch runs: the seam between storing a batch and detecting on it.

A single hub detects everything it stores (:class:`LocalPlacement`). A member of a sharded cluster
detects only the parts of a batch whose shard it owns, and forwards the others to their owners
(:class:`gpuscope.cluster.placement.ShardPlacement`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from gpuscope.model import Batch, Labels

Observe = Callable[[Batch], None]
WarmUp = Callable[[float, float], int]


class Placement(Protocol):
    def observe(self, batch: Batch, local: Observe) -> None:
        """Hand each part of a stored batch to the detectors that own it (``local``: this hub's)."""
        ...

    def owns(self, entity: Labels) -> bool:
        """Does this hub decide the alerts of ``entity``?"""
        ...

    def held(self) -> AbstractContextManager[object]:
        """Held while the hub evaluates: ownership does not change under an evaluation."""
        ...

    def resume(self, now: float, window: float, warm_up: WarmUp) -> None:
        """At start: warm the detectors up from the store (a cluster member does it per shard, as
        it takes them)."""
        ...

    def owner_url(self, batch: Batch) -> str | None:
        """Where the sender of ``batch`` should send its next batches (the hub owning its shard),
        told on every ingest answer; None when any hub will do."""
        ...


class LocalPlacement:
    """One hub: every part of every batch is detected here."""

    def observe(self, batch: Batch, local: Observe) -> None:
        local(batch)

    def owns(self, entity: Labels) -> bool:
        return True

    def held(self) -> AbstractContextManager[object]:
        return nullcontext()

    def resume(self, now: float, window: float, warm_up: WarmUp) -> None:
        warm_up(now, window)

    def owner_url(self, batch: Batch) -> str | None:
        return None
