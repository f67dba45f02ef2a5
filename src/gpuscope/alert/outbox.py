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


class Outbox:
    """Queue (durably) and deliver notification requests with retries and backoff."""

    def __init__(
        self,
        db: StateBackend,
        *,
        sender: Sender | None = None,
        counters: Counters | None = None,
        base_backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_age: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < base_backoff <= max_backoff or not math.isfinite(max_backoff) or max_age <= 0:
            raise ValueError("outbox: need 0 < base_backoff <= max_backoff (finite) and max_age > 0")
        self.db = db
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
        self, receiver: str, kind: str, requests: list[Request], now: float | None = None
    ) -> list[int]:
        """Commit requests to the outbox and wake the sender; returns their row ids."""
        ts = self.clock() if now is None else now
        ids: list[int] = []
        with self.db.tx() as con:
            for req in requests:
                doc = orjson.dumps({"url": req.url, "body": req.body, "headers": req.headers}).decode()
                cur = con.execute(
                    "INSERT INTO outbox (receiver, kind, payload, created_at, next_attempt_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (receiver, kind, doc, ts, ts),
                )
                ids.append(int(cur.lastrowid or 0))
        self.counters.inc("notifications_queued", len(ids))
        with self._wake:
            self._dirty = True
            self._wake.notify_all()
        return ids

    def pending(self) -> list[Pending]:
        """Every undelivered, live request, oldest first."""
        rows = self.db.query(
            "SELECT id, receiver, kind, payload, created_at, attempts, next_attempt_at FROM outbox "
            "WHERE delivered_at IS NULL AND dead_at IS NULL ORDER BY id"
        )
        out = []
        for rid, receiver, kind, payload, created, attempts, next_at in rows:
            doc = orjson.loads(payload)
            req = Request(doc["url"], doc["body"], doc.get("headers", {}))
            out.append(Pending(int(rid), receiver, kind, req, float(created), int(attempts), float(next_at)))
        return out

    def stats(self) -> dict[str, int]:
        (row,) = self.db.query(
            "SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), count(*) FILTER (WHERE dead_at IS NOT "
            "NULL), count(*) FILTER (WHERE delivered_at IS NULL AND dead_at IS NULL) FROM outbox"
        )
        return {"delivered": int(row[0]), "dead": int(row[1]), "pending": int(row[2])}

    def deliver_due(self, now: float | None = None) -> float | None:
        """Try every receiver whose oldest request is due; returns when the next one is due (or None)."""
        now = self.clock() if now is None else now
        heads: dict[str, Pending] = {}
        for row in self.pending():
            heads.setdefault(row.receiver, row)
        next_due: float | None = None
        for receiver, head in heads.items():
            item: Pending | None = head
            while item is not None:
                if item.next_attempt_at > now:
                    next_due = (
                        item.next_attempt_at if next_due is None else min(next_due, item.next_attempt_at)
                    )
                    break
                if not self._attempt(item, now):
                    retry = self._row_next_attempt(item.id)
                    if retry is not None:
                        next_due = retry if next_due is None else min(next_due, retry)
                        break
                item = self._head(receiver)
        return next_due

    def _head(self, receiver: str) -> Pending | None:
        return next((p for p in self.pending() if p.receiver == receiver), None)

    def _row_next_attempt(self, row_id: int) -> float | None:
        rows = self.db.query(
            "SELECT next_attempt_at FROM outbox WHERE id = ? AND delivered_at IS NULL AND dead_at IS NULL",
            (row_id,),
        )
        return float(rows[0][0]) if rows else None

    def _attempt(self, item: Pending, now: float) -> bool:
        """One try; True when the row is finished with (delivered or dead)."""
        if now - item.created_at > self.max_age:
            self._dead(item, now, f"undelivered after {self.max_age:.0f} s")
            return True
        try:
            status = self.sender(item.request)
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except httpx.HTTPError as exc:
            status, error = 0, f"{type(exc).__name__}: {exc}"
        if error is None:
            with self.db.tx() as con:
                con.execute(
                    "UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, last_error = NULL "
                    "WHERE id = ?",
                    (now, item.id),
                )
            self.counters.inc("notifications_delivered")
            for observer in self.on_delivered:
                observer(item, now)
            return True
        if 400 <= status < 500 and status not in {408, 429}:
            self._dead(item, now, error)
            return True
        delay = min(self.base_backoff * 2**item.attempts, self.max_backoff)
        with self.db.tx() as con:
            con.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? WHERE id = ?",
                (now + delay, error, item.id),
            )
        self.counters.inc("notification_retries")
        log.info("receiver %s: %s; retrying in %.0f s", item.receiver, error, delay)
        return False

    def _dead(self, item: Pending, now: float, why: str) -> None:
        with self.db.tx() as con:
            con.execute("UPDATE outbox SET dead_at = ?, last_error = ? WHERE id = ?", (now, why, item.id))
        self.counters.inc("notifications_dead")
        log.error("receiver %s: notification %d given up: %s", item.receiver, item.id, why)

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
