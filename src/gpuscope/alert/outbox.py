"""The persisted outbox: every notification request is committed to disk before any attempt to send.

Delivery is at least once, in order per receiver: only the oldest undelivered request of a receiver
is tried, so a resolve never overtakes its trigger. A failure (connection refused, timeout, 5xx, 429)
backs the receiver off exponentially up to ``max_backoff``, and the request waits; a receiver that is
down loses nothing and gets everything, in order, when it is back. A 4xx other than 408/429 means the
request itself is wrong: it is set aside as dead (counted and logged), as is anything older than
``max_age``, so one bad request cannot block a receiver forever.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from gpuscope.alert.notify.base import Request
from gpuscope.alert.statedb import StateBackend
from gpuscope.counters import Counters
from gpuscope.redact import scrub_client_logs

log = logging.getLogger("gpuscope.alert.outbox")
scrub_client_logs()  # receivers' URLs hold secrets; httpx logs each request's URL at INFO

Sender = Callable[[Request], int]  # returns the HTTP status; raises httpx.HTTPError when unreachable


@dataclass(frozen=True, slots=True)
class Pending:
    id: int
    receiver: str
    kind: str
    request: Request
    created_at: float
    attempts: int
    next_attempt_at: float


def http_sender(timeout: float = 5.0) -> Sender:
    """POST JSON with httpx over one pooled client."""
    client = httpx.Client(timeout=timeout)

    def send(request: Request) -> int:
        body = orjson.dumps(request.body)
        headers = {"content-type": "application/json", **request.headers}
        return client.post(request.url, content=body, headers=headers).status_code

    return send


#: what became of one try: ("delivered" | "retry" | "dead", when to try again, the error)
Outcome = tuple[str, float | None, str | None]
Attempt = Callable[[Pending, float], Outcome]


@dataclass(frozen=True, slots=True)
class About:
    """What a notification tells: (alert id, "firing" | "resolved", the alert's tier) of each
    alert, at an escalation level (0: the routes' receivers)."""

    alerts: tuple[tuple[str, str, str], ...] = ()
    escalation: int = 0


class OutboxBackend(Protocol):
    """Where requests wait: one hub's SQLite rows, or a cluster's PostgreSQL rows that any member
    delivers (:class:`gpuscope.cluster.outbox.PgOutbox`)."""

    def add(self, receiver: str, kind: str, payloads: list[str], now: float, about: About) -> list[int]:
        """Commit requests; returns their row ids. ``about``: the alerts they tell of (with their
        status) and the escalation level, for a ledger that keeps them."""
        ...

    def receivers(self) -> list[str]:
        """Receivers with undelivered requests."""
        ...

    def try_head(self, receiver: str, now: float, attempt: Attempt) -> tuple[bool, float | None]:
        """Try the receiver's oldest undelivered request if it is due (and no other caller, on
        this hub or another, is trying the receiver now), recording the outcome with the try.
        Returns (finished with it: go on with the next, when the head is due next); a receiver
        another caller is trying is (False, None)."""
        ...

    def pending(self) -> list[Pending]:
        """Every undelivered, live request, oldest first."""
        ...

    def stats(self) -> dict[str, int]: ...


def pending_row(row: tuple[Any, ...]) -> Pending:
    """A request from its row (the columns every backend selects, in this order)."""
    rid, receiver, kind, payload, created, attempts, next_at = row
    doc = orjson.loads(payload)
    req = Request(doc["url"], doc["body"], doc.get("headers", {}))
    return Pending(int(rid), str(receiver), str(kind), req, float(created), int(attempts), float(next_at))


_COLUMNS = "id, receiver, kind, payload, created_at, attempts, next_attempt_at"
_LIVE = "delivered_at IS NULL AND dead_at IS NULL"


class LocalOutbox:
    """One hub's requests, in the ``outbox`` table of its alert state database.

    A receiver is claimed for the length of one try: the background sender and a direct
    :meth:`Outbox.deliver_due` (a flush, a test) would otherwise read the same head row and both
    send it. A caller that finds the receiver claimed skips it rather than waiting; the claimant
    goes on with the receiver's next request itself."""

    def __init__(self, db: StateBackend) -> None:
        self.db = db
        self._claims_lock = threading.Lock()
        self._claimed: set[str] = set()

    def add(self, receiver: str, kind: str, payloads: list[str], now: float, about: About) -> list[int]:
        ids: list[int] = []
        with self.db.tx() as con:
            for doc in payloads:
                cur = con.execute(
                    "INSERT INTO outbox (receiver, kind, payload, created_at, next_attempt_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (receiver, kind, doc, now, now),
                )
                ids.append(int(cur.lastrowid or 0))
        return ids

    def receivers(self) -> list[str]:
        return [str(r[0]) for r in self.db.query(f"SELECT DISTINCT receiver FROM outbox WHERE {_LIVE}")]

    def try_head(self, receiver: str, now: float, attempt: Attempt) -> tuple[bool, float | None]:
        with self._claims_lock:
            if receiver in self._claimed:
                return False, None  # another caller is trying this receiver's head
            self._claimed.add(receiver)
        try:
            return self._try_claimed_head(receiver, now, attempt)
        finally:
            with self._claims_lock:
                self._claimed.discard(receiver)

    def _try_claimed_head(self, receiver: str, now: float, attempt: Attempt) -> tuple[bool, float | None]:
        rows = self.db.query(
            f"SELECT {_COLUMNS} FROM outbox WHERE receiver = ? AND {_LIVE} ORDER BY id LIMIT 1", (receiver,)
        )
        if not rows:
            return False, None
        item = pending_row(rows[0])
        if item.next_attempt_at > now:
            return False, item.next_attempt_at
        what, retry_at, error = attempt(item, now)
        with self.db.tx() as con:
            if what == "delivered":
                con.execute(
                    "UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, last_error = NULL "
                    "WHERE id = ?",
                    (now, item.id),
                )
            elif what == "dead":
                con.execute(
                    "UPDATE outbox SET dead_at = ?, last_error = ? WHERE id = ?", (now, error, item.id)
                )
            else:
                con.execute(
                    "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? "
                    "WHERE id = ?",
                    (retry_at, error, item.id),
                )
        return what != "retry", retry_at

    def pending(self) -> list[Pending]:
        return [
            pending_row(r) for r in self.db.query(f"SELECT {_COLUMNS} FROM outbox WHERE {_LIVE} ORDER BY id")
        ]

    def stats(self) -> dict[str, int]:
        (row,) = self.db.query(
            "SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), count(*) FILTER (WHERE dead_at IS NOT "
            f"NULL), count(*) FILTER (WHERE {_LIVE}) FROM outbox"
        )
        return {"delivered": int(row[0]), "dead": int(row[1]), "pending": int(row[2])}


class Outbox:
    """Queue (durably) and deliver notification requests with retries and backoff."""

    def __init__(
        self,
        db: StateBackend,
        *,
        backend: OutboxBackend | None = None,
        sender: Sender | None = None,
        counters: Counters | None = None,
        base_backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_age: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``backend``: where requests wait (default: the ``outbox`` table of ``db``)."""
        if not 0 < base_backoff <= max_backoff or not math.isfinite(max_backoff) or max_age <= 0:
            raise ValueError("outbox: need 0 < base_backoff <= max_backoff (finite) and max_age > 0")
        self.db = db
        self.backend: OutboxBackend = backend if backend is not None else LocalOutbox(db)
        self.sender = sender or http_sender()
        self.counters = counters or Counters()
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.max_age = max_age
        self.clock = clock
        self._wake = threading.Condition()
        self._stop = False
        self._dirty = False  # something was queued since the sender last looked
        self._thread: threading.Thread | None = None
        #: observers of each delivery (benchmarks, history): (row, status, now)
        self.on_delivered: list[Callable[[Pending, float], None]] = []

    def enqueue(
        self,
        receiver: str,
        kind: str,
        requests: list[Request],
        now: float | None = None,
        about: About | None = None,
    ) -> list[int]:
        """Commit requests to the outbox and wake the sender; returns their row ids."""
        ts = self.clock() if now is None else now
        docs = [
            orjson.dumps({"url": req.url, "body": req.body, "headers": req.headers}).decode()
            for req in requests
        ]
        ids = self.backend.add(receiver, kind, docs, ts, about or About())
        self.counters.inc("notifications_queued", len(ids))
        with self._wake:
            self._dirty = True
            self._wake.notify_all()
        return ids

    def pending(self) -> list[Pending]:
        """Every undelivered, live request, oldest first."""
        return self.backend.pending()

    def stats(self) -> dict[str, int]:
        return self.backend.stats()

    def deliver_due(self, now: float | None = None) -> float | None:
        """Try every receiver whose oldest request is due; returns when the next one is due (or None)."""
        now = self.clock() if now is None else now
        next_due: float | None = None
        for receiver in self.backend.receivers():
            while True:
                finished, due = self.backend.try_head(receiver, now, self._attempt)
                if due is not None:
                    next_due = due if next_due is None else min(next_due, due)
                if not finished:
                    break
        return next_due

    def _attempt(self, item: Pending, now: float) -> Outcome:
        """One try of a due request."""
        if now - item.created_at > self.max_age:
            return self._dead(item, f"undelivered after {self.max_age:.0f} s")
        try:
            status = self.sender(item.request)
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except httpx.HTTPError as exc:
            status, error = 0, f"{type(exc).__name__}: {exc}"
        if error is None:
            self.counters.inc("notifications_delivered")
            for observer in self.on_delivered:
                observer(item, now)
            return "delivered", None, None
        if 400 <= status < 500 and status not in {408, 429}:
            return self._dead(item, error)
        delay = min(self.base_backoff * 2**item.attempts, self.max_backoff)
        self.counters.inc("notification_retries")
        log.info("receiver %s: %s; retrying in %.0f s", item.receiver, error, delay)
        return "retry", now + delay, error

    def _dead(self, item: Pending, why: str) -> Outcome:
        self.counters.inc("notifications_dead")
        log.error("receiver %s: notification %d given up: %s", item.receiver, item.id, why)
        return "dead", None, why

    # -- background delivery ------------------------------------------------------------------

    def start(self) -> None:
        """Deliver from a background thread until :meth:`stop`."""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="gpuscope-outbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stop:
                    return
                self._dirty = False
            try:
                next_due = self.deliver_due()
            except Exception:  # the sender must outlive any one bad row
                self.counters.inc("outbox_errors")
                log.exception("outbox delivery failed")
                next_due = self.clock() + self.base_backoff
            with self._wake:
                if self._stop:
                    return
                wait = 1.0 if next_due is None else max(0.0, min(next_due - self.clock(), 1.0))
                if wait > 0 and not self._dirty:
                    self._wake.wait(wait)

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
