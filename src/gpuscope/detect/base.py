"""The detector seam: detectors see samples, events and training records and emit findings.

A detector is one module that subclasses :class:`Detector` and decorates it with
:func:`register`; the engine finds it in the registry. Detectors are stateful and streaming
(they never query the store on the hot path) and are driven by the data's own timestamps, so
the same code runs live (wall clock) and in ``sim-eval`` (virtual time).

``evaluate(now)`` returns every finding whose condition holds *now*: the alert layer turns a
finding that appears into a firing alert and one that disappears into a resolved alert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from gpuscope.model import Event, Finding, Frame, TrainingRecord


class Detector:
    """Base class: override the ``on_*`` hooks a detector needs and :meth:`evaluate`."""

    #: rule names (DESIGN §3) this detector can raise
    rules: ClassVar[tuple[str, ...]] = ()

    def on_frame(self, frame: Frame) -> None:
        """A telemetry frame arrived (one timestamp, many entities)."""

    def on_event(self, event: Event) -> None:
        """An event arrived."""

    def on_training(self, record: TrainingRecord) -> None:
        """A training record arrived."""

    def evaluate(self, now: float) -> list[Finding]:
        """Findings whose condition holds at ``now``."""
        return []

    def replayed(self, now: float) -> None:
        """What arrived since the last evaluation was stored history replayed at ``now`` (hub
        start, shard takeover), not live traffic: judge its arrival by its own timestamps."""

    def hub_behind(self, now: float, behind: bool) -> None:
        """Whether the hub is behind on its own ingest (queueing or shedding senders' batches) at
        ``now``; called before each :meth:`evaluate`. A detector that judges silence withholds it."""


DETECTORS: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Class decorator: make a detector known to the engine."""
    DETECTORS[cls.__name__] = cls
    return cls


DetectorFactory = Callable[[], Detector]
