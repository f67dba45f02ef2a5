"""Named counters for what a stage refused, dropped or retried: nothing is dropped silently."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """Thread-safe monotonically increasing counters, reported through health endpoints."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter()

    def inc(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._values[name] += n

    def get(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
