"""Concurrent writers of the cluster's shared state on a real PostgreSQL: two members (an evaluator
and a triage worker of one member write the same way) writing the same alerts in opposite orders
while hubs connect, and transactions PostgreSQL aborts to break a deadlock, run again and counted."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from gpuscope.alert.outbox import About
from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.membership import ClusterNode, connect
from gpuscope.cluster.outbox import PgOutbox
from gpuscope.cluster.schema import create_schema
from gpuscope.cluster.sql import PgSql
from gpuscope.cluster.state import PgAlertState
from gpuscope.cluster.txretry import COUNTER, in_tx
from gpuscope.counters import Counters
from gpuscope.model import Alert

ALERTS = 6
ROUNDS = 8
RULE = "gpu_ecc_uncorrectable"


@dataclasses.dataclass
class Writer:
    node: ClusterNode
    state: PgAlertState
    outbox: PgOutbox


@pytest.fixture
def writers(postgres_dsn: str) -> Iterator[list[Writer]]:
    with connect(postgres_dsn) as con:
        create_schema(con)
    made = []
    for hub in ("hub-a", "hub-b"):
        cfg = ClusterConfig(postgres_dsn, hub, f"http://{hub}.invalid", "peer-token-0123456789", shards=16)
        node = ClusterNode(cfg)
        made.append(Writer(node, PgAlertState(node), PgOutbox(postgres_dsn, hub, node.counters)))
    yield made
    for w in made:
        w.outbox.close()
        w.state.close()
        w.node.con.close()


def _running(threads: list[threading.Thread], failed: list[BaseException]) -> Callable[..., None]:
    """Start ``target(*args)`` on a thread whose exception lands in ``failed``."""

    def start(target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # the test asserts none escaped
                failed.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)

    return start


def test_two_members_writing_the_same_alerts_in_opposite_orders_while_hubs_connect(
    writers: list[Writer], postgres_dsn: str
) -> None:
    a, b = writers
    now = time.time()
    alerts = [
        Alert(
            a.state.next_id(), "gpu_ecc_uncorrectable", "P1", "platform", {"node": f"n{i}"}, now, "dbe", 0.0
        )
        for i in range(ALERTS)
    ]
    for alert in alerts:
        assert a.state.write_fired(alert, now) is None
    done = threading.Event()
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []
    start = _running(threads, failed)

    def write(w: Writer, order: list[Alert]) -> None:
        for r in range(ROUNDS):
            for alert in order:
                mine = dataclasses.replace(alert, details={"playbook": {"by": w.node.hub_id, "round": r}})
                w.state.save(mine)  # the triage worker's attach: SELECT .. FOR UPDATE, UPDATE
                w.outbox.add(
                    "hook",
                    "firing",
                    [f"{w.node.hub_id}/{alert.id}/{r}"],
                    now,
                    About(((alert.id, "firing", alert.severity),)),
                )

    def connecting() -> None:  # hubs starting or reconnecting: each new connection makes sure of the schema
        while not done.is_set():
            PgSql(postgres_dsn, a.node.counters).close()

    start(connecting)
    start(write, a, alerts)
    start(write, b, alerts[::-1])
    for thread in threads[1:]:
        thread.join(timeout=60)
    done.set()
    threads[0].join(timeout=10)

    assert failed == []
    assert not any(t.is_alive() for t in threads)
    # one row, then the version lock, in every write: no lock cycle among them, nothing ran twice
    assert a.node.counters.get(COUNTER) == b.node.counters.get(COUNTER) == 0
    with connect(postgres_dsn) as con:
        told = dict(con.execute("SELECT alert_id, count(*) FROM cluster_told GROUP BY alert_id").fetchall())
        payloads = [r[0] for r in con.execute("SELECT payload FROM cluster_outbox").fetchall()]
        docs = con.execute("SELECT doc FROM cluster_alerts WHERE resolved_at IS NULL").fetchall()
    assert told == {alert.id: 2 * ROUNDS for alert in alerts}  # every write once: none lost, none twice
    assert sorted(payloads) == sorted(
        f"{w.node.hub_id}/{alert.id}/{r}" for w in writers for alert in alerts for r in range(ROUNDS)
    )
    assert len(docs) == ALERTS
    last = f'"round":{ROUNDS - 1}'
    assert all(last in doc for (doc,) in docs)  # each alert keeps a last round's playbook


def test_a_hub_connecting_does_not_wait_on_the_alert_rows_a_writer_holds(
    writers: list[Writer], postgres_dsn: str
) -> None:
    """The lock cycle of the deadlock seen in a combined run: a writer holds a row of
    ``cluster_alerts`` (``FOR UPDATE``) and goes on to ``UPDATE`` it, while a hub connecting runs
    the schema's DDL, whose ``ALTER TABLE .. IF NOT EXISTS`` waited for the table behind it."""
    a, _ = writers
    alert = Alert(
        a.state.next_id(), "gpu_ecc_uncorrectable", "P1", "platform", {"node": "n0"}, 1.0, "dbe", 0.0
    )
    assert a.state.write_fired(alert, 1.0) is None
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []
    with connect(postgres_dsn) as writer:
        with writer.transaction():
            writer.execute("SELECT doc FROM cluster_alerts WHERE id = %s FOR UPDATE", (alert.id,))
            _running(threads, failed)(lambda: PgSql(postgres_dsn).close())
            threads[0].join(timeout=5)
            waited = threads[0].is_alive()
            writer.execute("UPDATE cluster_alerts SET hub_id = 'hub-x' WHERE id = %s", (alert.id,))
        threads[0].join(timeout=10)
    assert not waited
    assert failed == []


def _locker(
    dsn: str, first: str, then: str, met: threading.Barrier, counters: Counters, runs: list[str]
) -> None:
    """Lock ``first`` then ``then``; the first run meets the other locker between the two."""

    def work(con: psycopg.Connection[Any]) -> None:
        runs.append(first)
        con.execute("UPDATE cluster_members SET url = url WHERE hub_id = %s", (first,))
        if runs.count(first) == 1:
            met.wait()
        con.execute("UPDATE cluster_members SET url = url WHERE hub_id = %s", (then,))
        con.execute(
            "INSERT INTO cluster_told (alert_id, receiver, status, escalation, sent_at) "
            "VALUES (%s, 'hook', 'firing', 0, 0)",
            (first,),
        )

    with connect(dsn) as con:
        in_tx(con, work, counters)


def test_a_transaction_aborted_by_a_deadlock_runs_again_and_is_counted(postgres_dsn: str) -> None:
    with connect(postgres_dsn) as con:
        create_schema(con)
        for hub in ("x", "y"):
            con.execute(
                "INSERT INTO cluster_members (hub_id, url, lock_key, lease_until) VALUES (%s, '', 0, now())",
                (hub,),
            )
    counters = Counters()
    met = threading.Barrier(2, timeout=10)
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []
    start = _running(threads, failed)
    runs: list[str] = []
    start(_locker, postgres_dsn, "x", "y", met, counters, runs)
    start(_locker, postgres_dsn, "y", "x", met, counters, runs)
    for thread in threads:
        thread.join(timeout=30)
    assert failed == []
    # PostgreSQL aborted one side of the cycle (and, on a loaded machine, may do so again when the
    # re-run takes its first row before the winner took it): every run after a first is counted
    assert len(runs) > 2
    assert counters.get(COUNTER) == len(runs) - 2
    with connect(postgres_dsn) as con:
        rows = sorted(r[0] for r in con.execute("SELECT alert_id FROM cluster_told").fetchall())
    assert rows == ["x", "y"]  # both transactions committed, each once


def test_retries_are_bounded_and_the_last_failure_is_raised(postgres_dsn: str) -> None:
    counters = Counters()
    runs = []

    def conflict(con: psycopg.Connection[Any]) -> None:
        runs.append(con.execute("SELECT 1").fetchone())
        raise errors.SerializationFailure("could not serialize access")

    with connect(postgres_dsn) as con:
        with pytest.raises(errors.SerializationFailure):
            in_tx(con, conflict, counters, attempts=3, pause_s=0.001)
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # rolled back

    assert len(runs) == 3
    assert counters.get(COUNTER) == 2


def test_other_errors_are_not_run_again(postgres_dsn: str) -> None:
    counters = Counters()
    runs = []

    def broken(con: psycopg.Connection[Any]) -> None:
        runs.append(1)
        con.execute("SELECT * FROM no_such_table")

    with connect(postgres_dsn) as con, pytest.raises(errors.UndefinedTable):
        in_tx(con, broken, counters)
    assert runs == [1]
    assert counters.get(COUNTER) == 0
