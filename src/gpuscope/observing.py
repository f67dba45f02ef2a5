"""The hub's observe stage: acknowledged batches wait here until its observers see them, a tick at once.

An ingest request stores its batch durably and is answered; what the hub then learns from the batch
(detectors, the productivity model, the quality monitor, lineage) does not need to happen inside
that request. Batches are queued in the order they were acknowledged and drained as one list per
tick, by the hub's evaluation before it evaluates (so detection sees everything acknowledged
before it, exactly as when each request observed its own batch), so the observers see a whole tick
at once instead of taking turns under a lock, request by request.

The queue is bounded: a request that finds it full drains it itself before it returns, so a hub
whose evaluation falls behind slows its senders down (and so sheds load, see
:mod:`gpuscope.ingest.overload`) instead of holding batches without limit. Nothing queued is ever
skipped: a failure of one observer on one tick is counted and logged, and the others, and the
next ticks, carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from gpuscope.counters import Counters
from gpuscope.model import Batch

log = logging.getLogger(__name__)

#: batches waiting at most (a tick of 4,096 agents fits twice)
MAX_PENDING = 8192
_LOGGED_FAILURES = 5

TickObserver = Callable[[list[Batch]], None]
BatchObserver = Callable[[Batch], None]


class ObserveStage:
    """Acknowledged batches, in order, for ``observers`` (each called with one tick's list).

    Thread-safe: requests :meth:`put` from worker threads; :meth:`drain` runs one tick at a time.
    """

    def __init__(self, counters: Counters, max_pending: int = MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        self.counters = counters
        self.max_pending = max_pending
        self._observers: list[tuple[str, TickObserver]] = []
        self._lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._draining: int | None = None  # the thread draining now
        #: (monotonic time acknowledged, batch), oldest first
        self._pending: deque[tuple[float, Batch]] = deque()

    def add(self, name: str, observer: TickObserver) -> None:
        """Observers run in the order they were added; ``name`` counts and logs their failures."""
        self._observers.append((name, observer))

    def add_each(self, name: str, observer: BatchObserver) -> None:
        """An observer of one batch at a time: failing on one batch, it still sees the next ones."""

        def each(batches: list[Batch]) -> None:
            for batch in batches:
                try:
                    observer(batch)
                except Exception:
                    self._failed(name, f"a batch from {batch.source}")

        self.add(name, each)

    def put(self, batch: Batch) -> None:
        """Queue an acknowledged batch; when the queue is full, drain it first (back-pressure)."""
        with self._lock:
            self._pending.append((time.monotonic(), batch))
            full = len(self._pending) > self.max_pending
        # an observer that ingests what it derives (quality monitor, lineage) runs in the draining
        # thread: its batch waits for the next tick rather than re-entering the drain under way
        if full and self._draining != threading.get_ident():
            self.counters.inc("observe_backpressure_drains")
            self.drain()

    def backlog(self) -> tuple[int, float]:
        """Batches waiting, and how long (seconds) the oldest has waited."""
        with self._lock:
            if not self._pending:
                return 0, 0.0
            return len(self._pending), time.monotonic() - self._pending[0][0]

    def drain(self) -> int:
        """Let every observer see, in order, every batch queued before this call; returns how many.

        Called again from inside an observer (which the stage does not do), it returns 0."""
        if self._draining == threading.get_ident():
            return 0
        with self._drain_lock:
            self._draining = threading.get_ident()
            try:
                with self._lock:
                    batches = [batch for _, batch in self._pending]
                    self._pending.clear()
                if batches:
                    for name, observer in self._observers:
                        self._run(name, observer, batches)
                    self.counters.inc("observe_ticks")
                    self.counters.inc("observe_batches", len(batches))
                return len(batches)
            finally:
                self._draining = None

    def _run(self, name: str, observer: TickObserver, batches: list[Batch]) -> None:
        try:
            observer(batches)
        except Exception:  # one observer must not blind the others, nor stop the next ticks
            self._failed(name, f"a tick of {len(batches)} batches")

    def _failed(self, name: str, what: str) -> None:
        counter = f"observe_errors_{name}"
        self.counters.inc(counter)
        if self.counters.get(counter) <= _LOGGED_FAILURES:  # a broken observer fails every time
            log.exception(
                "observer %s failed on %s (logged %d times at most, all counted)",
                name,
                what,
                _LOGGED_FAILURES,
            )
