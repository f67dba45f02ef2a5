"""Recently seen batch ids, so that a sender's retry of an acknowledged batch is stored once.

Bounded two ways: a count (the newest ``capacity`` ids) and an age (``ttl_s`` of wall-clock time,
because retries happen in real time whatever clock the data uses).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from enum import Enum


class Claim(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"


class BatchIds:
    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._pending: dict[str, threading.Event] = {}

    def load(self, rows: Iterable[tuple[str, float]]) -> None:
        with self._lock:
            for bid, received in rows:
                self._seen[bid] = received

    def claim(self, bid: str) -> Claim:
        """NEW (the caller now owns ``bid`` until :meth:`finish`) or DUPLICATE.

        If another caller is storing the same id right now, wait for its outcome: a duplicate
        only once that one is committed, a new claim if it failed.
        """
        while True:
            with self._lock:
                if bid in self._seen:
                    return Claim.DUPLICATE
                event = self._pending.get(bid)
                if event is None:
                    self._pending[bid] = threading.Event()
                    return Claim.NEW
            event.wait()

    def finish(self, bid: str, stored: bool, now: float) -> None:
        with self._lock:
            event = self._pending.pop(bid, None)
            if stored:
                self._seen[bid] = now
                self._seen.move_to_end(bid)
                self._evict(now)
        if event is not None:
            event.set()

    def _evict(self, now: float) -> None:
        while self._seen:
            oldest, received = next(iter(self._seen.items()))
            if len(self._seen) <= self.capacity and received >= now - self.ttl_s:
                break
            del self._seen[oldest]

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, bid: object) -> bool:
        """Whether ``bid`` was stored (and is still remembered)."""
        with self._lock:
            return bid in self._seen
