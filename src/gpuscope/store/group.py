"""Group commit: one writer thread turns many concurrent writes into one round trip.

Every commit costs something fixed: an fdatasync of DuckDB's WAL, an HTTP round trip to a remote
TSDB, a PostgreSQL transaction. Paying it per HTTP request caps ingest at a few hundred batches
per second, and on a shared machine each round trip also waits for a CPU. Callers enqueue their
item and wait on their own future; the writer takes everything queued (up to a size budget) and
commits it at once. Used by the embedded store (:mod:`gpuscope.store.duckdb`) and the remote
backend's writes (:mod:`gpuscope.store.remote`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class WriterClosed(RuntimeError):
    """The writer was closed before the item could be committed."""


class GroupCommitter(Generic[T, R]):
    """Runs ``commit(items) -> results`` on a dedicated thread for groups of queued items.

    If a group fails, each of its items is retried alone, so one bad batch cannot fail its
    neighbours; the failing one gets the exception.
    """

    def __init__(
        self,
        commit: Callable[[list[T]], list[R]],
        size: Callable[[T], int],
        max_group_rows: int,
        name: str = "gpuscope-store-writer",
        linger_s: float = 0.0,
    ) -> None:
        self._commit = commit
        self._size = size
        self._max_rows = max_group_rows
        self._linger_s = linger_s
        self._last_group = 1
        self._cond = threading.Condition()
        self._queue: deque[tuple[T, Future[R]]] = deque()
        self._closing = False
        self.groups = 0
        self.items = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> Future[R]:
        fut: Future[R] = Future()
        with self._cond:
            if self._closing:
                raise WriterClosed("the store is closed")
            self._queue.append((item, fut))
            self._cond.notify()
        return fut

    def _take(self) -> list[tuple[T, Future[R]]] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            if self._linger_s > 0 and self._last_group > 1 and len(self._queue) < self._last_group:
                # Concurrent senders: each commit's statements and fsync cost about as much CPU
                # for one batch as for dozens, so wait briefly for the rest of the wave. A lone
                # sender (groups of one) never waits.
                deadline = time.monotonic() + self._linger_s
                while not self._closing and len(self._queue) < self._last_group:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            group = [self._queue.popleft()]
            rows = self._size(group[0][0])
            while self._queue and rows + self._size(self._queue[0][0]) <= self._max_rows:
                item = self._queue.popleft()
                rows += self._size(item[0])
                group.append(item)
            self._last_group = len(group)
            return group

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            self.groups += 1
            self.items += len(group)
            try:
                results = self._commit([item for item, _ in group])
            except BaseException as exc:
                if len(group) == 1:
                    group[0][1].set_exception(exc)
                    continue
                for item, fut in group:
                    try:
                        fut.set_result(self._commit([item])[0])
                    except BaseException as single:
                        fut.set_exception(single)
                continue
            for (_, fut), result in zip(group, results, strict=True):
                fut.set_result(result)

    def close(self) -> None:
        """Commit everything queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
