"""Delivering the cluster's outbox: any live hub may send, each row goes out in order per receiver.

A hub claims a receiver with a transaction-level advisory lock, takes the receiver's oldest
undelivered row ``FOR UPDATE SKIP LOCKED``, sends it, marks it delivered and commits. Other hubs
skip a claimed receiver, so a receiver's notifications go out one at a time, oldest first (a
resolve never overtakes its trigger), and a hub that dies mid-send leaves the row to the others.

Delivery is at least once: a hub killed after the receiver accepted a request but before its
commit leaves the row undelivered, and another hub sends it again. That window is one HTTP
round trip plus one commit; receivers de-duplicate on the alert's fingerprint and status.
Failures back off exponentially per row, and a request refused as malformed (4xx other than
408/429) or older than ``max_age`` is set aside as dead, as the single-hub outbox does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import psycopg

from gpuscope.alert.notify.base import Request
from gpuscope.alert.outbox import Sender, http_sender
from gpuscope.cluster.membership import connect
from gpuscope.cluster.schema import NS_OUTBOX
from gpuscope.counters import Counters

log = logging.getLogger("gpuscope.cluster.outbox")


class ClusterOutbox:
    def __init__(
        self,
        dsn: str,
        hub_id: str,
        *,
        sender: Sender | None = None,
        counters: Counters | None = None,
        base_backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_age: float = 86400.0,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dsn = dsn
        self.hub_id = hub_id
        self.sender = sender or http_sender()
        self.counters = counters or Counters()
        self.base_backoff, self.max_backoff, self.max_age = base_backoff, max_backoff, max_age
        self.poll_s = poll_s
        self.clock = clock
        self._con: psycopg.Connection[tuple[Any, ...]] | None = None
        self._lock = threading.Lock()  # one connection: delivery and stats take turns
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def deliver_due(self) -> int:
        """Send every due row this hub can claim; returns how many were finished with."""
        with self._lock:
            return self._deliver_due()

    def _deliver_due(self) -> int:
        if self._con is None:
            self._con = connect(self.dsn)
        con = self._con
        now = self.clock()
        receivers = [
            str(r[0])
            for r in con.execute(
                "SELECT DISTINCT receiver FROM cluster_outbox "
                "WHERE delivered_at IS NULL AND dead_at IS NULL AND next_attempt_at <= %s",
                (now,),
            ).fetchall()
        ]
        done = 0
        for receiver in receivers:
            while self._one(con, receiver):
                done += 1
        return done

    def _one(self, con: psycopg.Connection[tuple[Any, ...]], receiver: str) -> bool:
        """Claim and try the receiver's oldest row; True when it is finished with (go on)."""
        with con.transaction():
            got = con.execute(
                "SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", (NS_OUTBOX, receiver)
            ).fetchone()
            if not got or not got[0]:
                return False  # another hub is sending to this receiver
            row = con.execute(
                "SELECT id, payload, created_at, attempts, next_attempt_at FROM cluster_outbox "
                "WHERE receiver = %s AND delivered_at IS NULL AND dead_at IS NULL "
                "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                (receiver,),
            ).fetchone()
            now = self.clock()
            if row is None or float(row[4]) > now:
                return False
            rid, payload, created, attempts = int(row[0]), str(row[1]), float(row[2]), int(row[3])
            if now - created > self.max_age:
                return self._dead(con, rid, receiver, now, f"undelivered after {self.max_age:.0f} s")
            doc = orjson.loads(payload)
            try:
                status = self.sender(Request(doc["url"], doc["body"], doc.get("headers", {})))
                error = None if 200 <= status < 300 else f"HTTP {status}"
            except httpx.HTTPError as exc:
                status, error = 0, f"{type(exc).__name__}: {exc}"
            if error is None:
                con.execute(
                    "UPDATE cluster_outbox SET delivered_at = %s, delivered_by = %s, "
                    "attempts = attempts + 1, last_error = NULL WHERE id = %s",
                    (now, self.hub_id, rid),
                )
                self.counters.inc("notifications_delivered")
                return True
            if 400 <= status < 500 and status not in {408, 429}:
                return self._dead(con, rid, receiver, now, error)
            delay = min(self.base_backoff * 2**attempts, self.max_backoff)
            con.execute(
                "UPDATE cluster_outbox SET attempts = attempts + 1, next_attempt_at = %s, last_error = %s "
                "WHERE id = %s",
                (now + delay, error, rid),
            )
            self.counters.inc("notification_retries")
            log.info("receiver %s: %s; retrying in %.0f s", receiver, error, delay)
            return False

    def _dead(
        self, con: psycopg.Connection[tuple[Any, ...]], rid: int, receiver: str, now: float, why: str
    ) -> bool:
        con.execute("UPDATE cluster_outbox SET dead_at = %s, last_error = %s WHERE id = %s", (now, why, rid))
        self.counters.inc("notifications_dead")
        log.error("receiver %s: notification %d given up: %s", receiver, rid, why)
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            if self._con is None:
                self._con = connect(self.dsn)
            row = self._con.execute(
                "SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), "
                "count(*) FILTER (WHERE dead_at IS NOT NULL), "
                "count(*) FILTER (WHERE delivered_at IS NULL AND dead_at IS NULL) FROM cluster_outbox"
            ).fetchone()
        assert row is not None
        return {"delivered": int(row[0]), "dead": int(row[1]), "pending": int(row[2])}

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuscope-cluster-outbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.deliver_due()
            except psycopg.Error:
                self.counters.inc("outbox_errors")
                log.exception("cluster outbox delivery failed")
                with self._lock:
                    if self._con is not None:
                        self._con.close()
                    self._con = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
