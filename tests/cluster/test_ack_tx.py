"""An incident's acknowledgement on PostgreSQL (a cluster member's alert state database): its
``acks`` rows are taken in one order, their key's, so two acknowledgements of overlapping alerts
cannot lock each other's rows in opposite orders; and a transaction PostgreSQL aborts to break a
deadlock with another writer is run again, not lost.

A real PostgreSQL; a second session plays the other writer, holding rows the acknowledgement needs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from alert.rig import Rig, lost
from alert.sink import Clock
from gpuscope.alert.labels import fingerprint
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.cluster.membership import connect
from gpuscope.cluster.outbox import PgOutbox
from gpuscope.cluster.sql import PgSql
from gpuscope.cluster.txretry import COUNTER
from gpuscope.model import Alert
from support import wait_until

GPUS = 8


@pytest.fixture
def rig(postgres_dsn: str) -> Iterator[tuple[Rig, list[Alert]]]:
    """One hub whose alerting state lives in PostgreSQL, with one incident of ``GPUS`` alerts."""
    with connect(postgres_dsn) as con:  # the acknowledgement's session looks for a deadlock first
        con.execute(f"ALTER DATABASE {con.info.dbname} SET deadlock_timeout = '3s'")
    made = Rig({}, Clock())
    made.service.db.close()
    outbox = PgOutbox(postgres_dsn, "hub-a", made.hub.counters)
    made.service = AlertingService(
        made.hub,
        parse_alerting({}),
        db=PgSql(postgres_dsn, made.hub.counters),
        outbox=outbox,
        ledger=outbox,
        clock=made.clock,
    )
    made.step(0, [lost(str(g), "node-1") for g in range(GPUS)])
    alerts = sorted(made.hub.firing(), key=fingerprint)
    assert len(alerts) == GPUS
    try:
        yield made, alerts
    finally:
        made.close()
        outbox.close()


def _waiting_on_a_lock(other: psycopg.Connection[Any]) -> bool:
    """Whether a session other than ``other`` waits for a lock (asked in ``other``'s transaction)."""
    row = other.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()
    return bool(row and row[0])


def _hold(con: psycopg.Connection[Any], fp: str) -> None:
    """Write ``fp``'s acknowledgement row in ``con``'s open transaction (its row lock is held)."""
    con.execute(
        "INSERT INTO acks (alert_id, doc) VALUES (%s, '{}') ON CONFLICT (alert_id) DO UPDATE SET doc = '{}'",
        (fp,),
    )


def _ack_in_thread(service: AlertingService, target: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(service.ack(target, "alice", "on it"))
        except BaseException as exc:  # the test asserts on it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_an_incident_acknowledgement_takes_its_rows_in_key_order(
    rig: tuple[Rig, list[Alert]], postgres_dsn: str
) -> None:
    """Another writer holds the first row in key order: the acknowledgement waits for it holding
    nothing, so the other writer takes every other row without waiting."""
    made, alerts = rig
    (incident,) = made.hub.alerts.incidents()
    fps = [fingerprint(a) for a in alerts]
    with connect(postgres_dsn) as other:
        other.autocommit = False
        other.execute("SET lock_timeout = '3s'")  # waiting on the acknowledgement is the failure
        _hold(other, fps[0])
        thread, out = _ack_in_thread(made.service, incident.id)
        wait_until(lambda: _waiting_on_a_lock(other), 10, "the acknowledgement to wait", 0.02)
        for fp in fps[1:]:
            _hold(other, fp)  # raises LockNotAvailable if the acknowledgement holds this row
        other.commit()
    thread.join(timeout=30)
    (acked,) = out
    assert not isinstance(acked, BaseException), acked
    assert [a.id for a in acked] == [a.id for a in alerts]
    stored = dict(made.service.db.query("SELECT alert_id, doc FROM acks"))
    assert all('"alice"' in stored[fp] for fp in fps)


def test_an_acknowledgement_aborted_to_break_a_deadlock_is_run_again(
    rig: tuple[Rig, list[Alert]], postgres_dsn: str
) -> None:
    """The other writer holds the last row, the acknowledgement takes the others and waits for
    it, the other writer then asks for the first: PostgreSQL aborts the acknowledgement (it waited
    first), which runs again once the other commits."""
    made, alerts = rig
    (incident,) = made.hub.alerts.incidents()
    fps = [fingerprint(a) for a in alerts]
    with connect(postgres_dsn) as other:
        other.autocommit = False
        other.execute("SET deadlock_timeout = '60s'")  # the acknowledgement's session (3 s) detects it
        _hold(other, fps[-1])
        thread, out = _ack_in_thread(made.service, incident.id)
        wait_until(lambda: _waiting_on_a_lock(other), 10, "the acknowledgement to wait", 0.02)
        started = time.monotonic()
        _hold(other, fps[0])  # the cycle; returns once PostgreSQL aborted the acknowledgement's run
        assert time.monotonic() - started < 30  # it was the acknowledgement that was aborted
        other.commit()
    thread.join(timeout=30)
    (acked,) = out
    assert not isinstance(acked, BaseException), acked
    assert len(acked) == GPUS
    assert made.hub.counters.get(COUNTER) >= 1
    stored = dict(made.service.db.query("SELECT alert_id, doc FROM acks"))
    assert all('"alice"' in stored[fp] for fp in fps)
    history = made.service.history()
    assert sum(1 for row in history if row["what"] == "acknowledged") == GPUS  # the aborted run left none
