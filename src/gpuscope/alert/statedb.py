"""The alert layer's own small durable state: outbox, silences, acknowledgements, history.

SQLite (standard library) in WAL mode: every row is committed before the call returns, so a hub
that crashes loses no queued notification, silence or acknowledgement. ``:memory:`` serves tests
and ``sim-eval``. One connection behind a lock: the writers are the evaluator and HTTP threads.

The alert layer speaks to it through :class:`StateBackend` only (SQLite's dialect: ``?``
placeholders, ``INSERT OR REPLACE``), so sharded hubs run the same code on PostgreSQL
(:mod:`gpuscope.cluster.sql`), where every hub sees the same silences, acknowledgements and history.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    delivered_at REAL,
    dead_at REAL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (receiver, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    ends_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS acks (
    alert_id TEXT PRIMARY KEY,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    alert_id TEXT NOT NULL,
    what TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_alert ON history (alert_id, seq);
"""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    @property
    def lastrowid(self) -> int | None: ...
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


class StateBackend(Protocol):
    """What the alert layer needs of its state database (SQLite here, PostgreSQL in a cluster)."""

    #: True when other hubs write the same tables: cached copies must be re-read, not trusted
    shared: bool

    def tx(self) -> AbstractContextManager[Connection]: ...
    def transact(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one transaction, committed on return; a shared backend runs it again when
        the server aborted it to break a deadlock (``work`` must have no other effect)."""
        ...

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...
    def close(self) -> None: ...


class StateDB:
    """A thread-safe SQLite handle with the alert layer's schema."""

    shared = False

    def __init__(self, path: str = ":memory:") -> None:
        self.path = path
        self._con = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if path != ":memory:":
            os.chmod(path, 0o600)  # receivers' URLs and routing keys are secrets
        self._lock = threading.RLock()
        with self._lock:
            if path != ":memory:":
                self._con.execute("PRAGMA journal_mode=WAL")
                self._con.execute("PRAGMA synchronous=FULL")
            self._con.executescript(_SCHEMA)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction, committed on exit (rolled back on error)."""
        with self._lock:
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield self._con
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def transact(self, work: Callable[[Connection], T]) -> T:
        """One transaction (one writer at a time: nothing to run again)."""
        with self.tx() as con:
            return work(con)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._con.close()
