"""Input a detector cannot use is counted, and logged only the first few times per kind.

A misbehaving sender repeats its mistake on every batch; the counter says how often, the log
says what was wrong, and neither floods.
"""

from __future__ import annotations

import logging

from gpuscope.counters import Counters
from gpuscope.detect.frames import GpuKey
from gpuscope.model import Event

log = logging.getLogger("gpuscope.detect")

LOGGED_PER_KIND = 5


def refuse(counters: Counters, kind: str, message: str, *args: object) -> None:
    """Count one unusable input under ``kind``; log ``message % args`` for the first few of each kind."""
    counters.inc(kind)
    if counters.get(kind) <= LOGGED_PER_KIND:
        log.warning(message + " [counted as %s; logged %d times at most]", *args, kind, LOGGED_PER_KIND)


def event_gpu(counters: Counters, event: Event, kind: str) -> GpuKey | None:
    """The GPU an event names by its ``node`` and ``gpu`` labels; None, refused under ``kind``,
    where either is missing."""
    node, gpu = event.labels.get("node"), event.labels.get("gpu")
    if node is None or gpu is None:
        refuse(
            counters, kind, "%s event at %s lacks labels node and gpu: %s", event.kind, event.ts, event.labels
        )
        return None
    return node, gpu
