"""The cluster's outbox: an :class:`~gpuscope.alert.outbox.OutboxBackend` in PostgreSQL that any
live member delivers, and the :class:`~gpuscope.alert.ledger.DispatchLedger` its rows make.

A hub claims a receiver with a transaction-level advisory lock, takes the receiver's oldest
undelivered row ``FOR UPDATE SKIP LOCKED``, sends it, records the outcome and commits. Other hubs
skip a claimed receiver, so a receiver's notifications go out one at a time, oldest first (a
resolve never overtakes its trigger), and a hub that dies mid-send leaves the row to the others.
Retries, backoff and dead rows are the single hub's (:class:`~gpuscope.alert.outbox.Outbox`).

Delivery is at least once: a hub killed after the receiver accepted a request but before its
commit leaves the row undelivered, and another hub sends it again. That window is one HTTP
round trip plus one commit; receivers de-duplicate on the alert's fingerprint and status.

Each queued notification writes, in the same transaction, which alerts it tells of, with their
status and tier (``cluster_told``): the ledger a member reads when it takes over a shard.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg

from gpuscope.alert.engine import graver
from gpuscope.alert.ledger import Told
from gpuscope.alert.outbox import About, Attempt, Pending, pending_row
from gpuscope.cluster.membership import connect
from gpuscope.cluster.schema import NS_OUTBOX, create_schema
from gpuscope.cluster.txretry import in_tx
from gpuscope.counters import Counters

_COLUMNS = "id, receiver, kind, payload, created_at, attempts, next_attempt_at"
_LIVE = "delivered_at IS NULL AND dead_at IS NULL"


class PgOutbox:
    """Rows of ``cluster_outbox``; one connection sends (held across a send), one queues and reads."""

    def __init__(self, dsn: str, hub_id: str, counters: Counters | None = None) -> None:
        self.dsn = dsn
        self.hub_id = hub_id
        self.counters = counters if counters is not None else Counters()
        self._send: psycopg.Connection[tuple[Any, ...]] | None = None
        self._rw: psycopg.Connection[tuple[Any, ...]] | None = None
        self._send_lock = threading.Lock()
        self._rw_lock = threading.Lock()
        self._schema = False  # the outbox may run before this hub has joined (and made the tables)

    def _conn(self, which: str) -> psycopg.Connection[tuple[Any, ...]]:
        con = self._send if which == "send" else self._rw
        if con is None or con.closed:
            con = connect(self.dsn)
            if not self._schema:
                create_schema(con, self.counters)
                self._schema = True
            if which == "send":
                self._send = con
            else:
                self._rw = con
        return con

    # -- OutboxBackend ------------------------------------------------------------------------

    def add(self, receiver: str, kind: str, payloads: list[str], now: float, about: About) -> list[int]:
        def queue(con: psycopg.Connection[Any]) -> list[int]:
            ids: list[int] = []
            for doc in payloads:
                row = con.execute(
                    "INSERT INTO cluster_outbox "
                    "(dedup, receiver, kind, payload, created_at, next_attempt_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                    (f"{self.hub_id}/{uuid.uuid4().hex}", receiver, kind, doc, now, now),
                ).fetchone()
                ids.append(int(row[0]) if row else 0)
            for alert_id, status, severity in about.alerts:
                con.execute(
                    "INSERT INTO cluster_told (alert_id, receiver, status, escalation, sent_at, severity) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
                    (alert_id, receiver, status, about.escalation, now, severity),
                )
            return ids

        with self._rw_lock:
            con = self._conn("rw")
            try:
                return in_tx(con, queue, self.counters)
            except psycopg.OperationalError:
                con.close()
                raise

    def receivers(self) -> list[str]:
        rows = self._read(f"SELECT DISTINCT receiver FROM cluster_outbox WHERE {_LIVE}", ())
        return [str(r[0]) for r in rows]

    def try_head(self, receiver: str, now: float, attempt: Attempt) -> tuple[bool, float | None]:
        with self._send_lock:
            con = self._conn("send")
            try:
                # not re-run on a deadlock (txretry.in_tx): the send happens inside the transaction
                with con.transaction():
                    got = con.execute(
                        "SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", (NS_OUTBOX, receiver)
                    ).fetchone()
                    if not got or not got[0]:
                        return False, None  # another hub is sending to this receiver
                    row = con.execute(
                        f"SELECT {_COLUMNS} FROM cluster_outbox WHERE receiver = %s AND {_LIVE} "
                        "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                        (receiver,),
                    ).fetchone()
                    if row is None:
                        return False, None
                    item = pending_row(row)
                    if item.next_attempt_at > now:
                        return False, item.next_attempt_at
                    what, retry_at, error = attempt(item, now)
                    if what == "delivered":
                        con.execute(
                            "UPDATE cluster_outbox SET delivered_at = %s, delivered_by = %s, "
                            "attempts = attempts + 1, last_error = NULL WHERE id = %s",
                            (now, self.hub_id, item.id),
                        )
                    elif what == "dead":
                        con.execute(
                            "UPDATE cluster_outbox SET dead_at = %s, last_error = %s WHERE id = %s",
                            (now, error, item.id),
                        )
                    else:
                        con.execute(
                            "UPDATE cluster_outbox SET attempts = attempts + 1, next_attempt_at = %s, "
                            "last_error = %s WHERE id = %s",
                            (retry_at, error, item.id),
                        )
                    return what != "retry", retry_at
            except psycopg.OperationalError:
                con.close()
                raise

    def pending(self) -> list[Pending]:
        rows = self._read(f"SELECT {_COLUMNS} FROM cluster_outbox WHERE {_LIVE} ORDER BY id", ())
        return [pending_row(r) for r in rows]

    def stats(self) -> dict[str, int]:
        (row,) = self._read(
            "SELECT count(*) FILTER (WHERE delivered_at IS NOT NULL), "
            "count(*) FILTER (WHERE dead_at IS NOT NULL), "
            f"count(*) FILTER (WHERE {_LIVE}) FROM cluster_outbox",
            (),
        )
        return {"delivered": int(row[0]), "dead": int(row[1]), "pending": int(row[2])}

    # -- DispatchLedger -----------------------------------------------------------------------

    def told(self, alert_id: str) -> Told:
        return self.told_many([alert_id]).get(alert_id, Told())

    def told_many(self, alert_ids: list[str]) -> dict[str, Told]:
        rows = self._read(
            "SELECT alert_id, receiver, status, escalation, severity, max(sent_at) FROM cluster_told "
            "WHERE alert_id = ANY(%s) GROUP BY alert_id, receiver, status, escalation, severity",
            (list(alert_ids),),
        )
        by_alert: dict[str, list[tuple[Any, ...]]] = {}
        for alert_id, *row in rows:
            by_alert.setdefault(str(alert_id), []).append(tuple(row))
        out: dict[str, Told] = {}
        for alert_id, told in by_alert.items():
            firing: dict[str, float] = {}
            resolved: dict[str, float] = {}
            severity: dict[str, str] = {}
            for receiver, status, esc, tier, at in told:
                if int(esc) > 0:
                    continue
                seen = firing if status == "firing" else resolved
                seen[str(receiver)] = max(float(at), seen.get(str(receiver), float("-inf")))
                if status == "firing" and tier:  # "": told before tiers were kept
                    severity[str(receiver)] = graver(severity.get(str(receiver), str(tier)), str(tier))
            escalated = frozenset(int(esc) - 1 for _r, _st, esc, _sev, _t in told if int(esc) > 0)
            out[alert_id] = Told(firing, escalated, resolved, severity)
        return out

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._rw_lock:
            con = self._conn("rw")
            try:
                with con.transaction():
                    return con.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                con.close()
                raise

    def close(self) -> None:
        for lock, which in ((self._send_lock, "send"), (self._rw_lock, "rw")):
            with lock:
                con = self._send if which == "send" else self._rw
                if con is not None:
                    con.close()
