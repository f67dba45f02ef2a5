"""Alert state shared by every hub of a cluster, in PostgreSQL: the cluster's backend of
:class:`~gpuscope.alert.state.AlertState`.

An alert's transitions (fired, resolved) are written by the owner of its shard, keyed so that a
repeat is a no-op: at most one firing alert per rule and entity (a partial unique index). The
writes go over the session that holds the owner's shard locks: if that session is gone, so are
the locks, and the write fails. Notifications are the owner's alerting service's, as on a single
hub; what it sent is kept with the cluster's outbox (:mod:`.outbox`).

Every write stamps the row with the next ``version`` while holding one transaction-level advisory
lock, so versions become visible in the order they were given: each member reads only the rows
whose version is above the highest it has read (the cluster's alert view is incremental: a fired
alert does not re-read every alert the cluster ever had), and regroups incidents in memory.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg

from gpuscope.alert.engine import ESCALATED_FROM, KEPT_DETAILS, graver
from gpuscope.alert.incidents import Incident, IncidentTracker
from gpuscope.cluster.membership import ClusterNode, connect
from gpuscope.cluster.ring import entity_shard
from gpuscope.cluster.schema import NS_ALERT_VERSION
from gpuscope.cluster.txretry import in_tx
from gpuscope.model import Alert, Labels
from gpuscope.store.alert_docs import alert_doc


def entity_key(entity: dict[str, str]) -> str:
    return orjson.dumps(dict(sorted(entity.items()))).decode()


def _keep_stored(alert: Alert, stored: str) -> None:
    """Keep what other hubs attached to the stored alert (an acknowledgement, the playbook) when
    this hub writes its own copy of it."""
    details = orjson.loads(stored).get("details") or {}
    for key in KEPT_DETAILS:
        if key in details and (key == "ack" or key not in alert.details):
            alert.details[key] = details[key]


def _stamp(con: psycopg.Connection[Any], alert_id: str) -> None:
    """Give a written row the next version, in commit order (caller is inside the transaction)."""
    con.execute("SELECT pg_advisory_xact_lock(%s, 0)", (NS_ALERT_VERSION,))
    con.execute(
        "UPDATE cluster_alerts SET version = nextval('cluster_alert_version_seq') WHERE id = %s", (alert_id,)
    )


class _Held(threading.local):
    """What a thread's open :meth:`PgAlertState.batch` holds until it ends (None: no batch open):
    the alerts fired, joined to their incidents then, and the alerts saved, written then."""

    alerts: list[Alert] | None = None
    saves: list[Alert] | None = None


class PgAlertState:
    """The cluster's alerts and outbox; writes on the owner's locked session, reads on their own."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.shards = node.cfg.shards
        self._read = connect(node.cfg.postgres_dsn)
        self._read_lock = threading.Lock()
        #: how incidents group (the alert engine's defaults)
        self.incident_window, self.reopen_within = 600.0, 120.0
        #: the cluster's alerts as last read (seq -> alert, its places), and the highest version read
        self._rows: dict[int, tuple[Alert, list[Labels] | None]] = {}
        self._version = -1  # rows written before versions existed have version 0
        #: rows read by :meth:`view` since start (the incremental reads' measure)
        self.rows_read = 0
        #: incident regroupings (:meth:`view`) since start: one per evaluation that fired, not per alert
        self.views = 0
        self._held = _Held()

    # -- AlertState ---------------------------------------------------------------------------

    def fired(self, alert: Alert, places: list[Labels] | None, now: float) -> Alert | None:
        theirs = self.write_fired(alert, now, places)
        joined = alert if theirs is None else theirs
        held = self._held.alerts
        if held is not None:
            held.append(joined)
        else:
            self._join_incidents([joined])
        return theirs

    def resolved(self, alert: Alert, now: float) -> bool:
        return self.write_resolved(alert, now)

    def continued(self, alerts: list[Alert]) -> None:
        """Continued alerts are in PostgreSQL already."""

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Each transition stays its own transaction: a fired alert must learn at once whether
        another hub already fires it. What fired inside the block joins its incidents once, when
        the block ends (before anyone is told of it): a regrouping per alert made an evaluation
        that fires N alerts cost N passes over every alert of the cluster. What was saved inside
        the block (playbooks of a triage pass, escalations) is written in one transaction then."""
        if self._held.alerts is not None:  # nested: the outer block joins and writes
            yield
            return
        fired: list[Alert] = []
        saves: list[Alert] = []
        self._held.alerts, self._held.saves = fired, saves
        try:
            yield
        finally:
            self._held.alerts = self._held.saves = None
            try:
                self.save_all(saves)
            finally:
                self._join_incidents(fired)

    def resumed(self) -> list[Alert]:
        """A member continues the firing alerts of the shards it takes, as it takes them."""
        return []

    def shard(self, alert: Alert) -> int:
        return entity_shard(alert.entity, self.shards)

    def next_id(self) -> str:
        """A cluster-wide alert id (``al-N``), from a sequence: ids never collide across hubs."""
        with self.node.lock:
            row = self.node.con.execute("SELECT nextval('cluster_alert_seq')").fetchone()
        return f"al-{int(row[0]) if row else 0}"

    def write_fired(self, alert: Alert, now: float, places: list[Labels] | None = None) -> Alert | None:
        """Record a fired alert (with where it runs, for incidents); returns the alert already
        firing on the same rule and entity instead when there is one."""

        def write(con: psycopg.Connection[Any]) -> Alert | None:
            cur = con.execute(
                "INSERT INTO cluster_alerts (id, shard, rule, entity_key, started_at, doc, hub_id, places) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (rule, entity_key) WHERE resolved_at IS NULL DO NOTHING",
                (
                    alert.id,
                    self.shard(alert),
                    alert.rule,
                    entity_key(alert.entity),
                    alert.started_at,
                    alert_doc(alert),
                    self.node.hub_id,
                    None if places is None else orjson.dumps(places).decode(),
                ),
            )
            if cur.rowcount == 0:
                row = con.execute(
                    "SELECT doc FROM cluster_alerts "
                    "WHERE rule = %s AND entity_key = %s AND resolved_at IS NULL",
                    (alert.rule, entity_key(alert.entity)),
                ).fetchone()
                return Alert(**orjson.loads(row[0])) if row else None
            _stamp(con, alert.id)
            return None

        with self.node.lock:
            return in_tx(self.node.con, write, self.node.counters)

    def write_resolved(self, alert: Alert, now: float) -> bool:
        """Record a resolution; False when it was already resolved."""

        def write(con: psycopg.Connection[Any]) -> bool:
            row = con.execute(
                "SELECT doc FROM cluster_alerts WHERE id = %s AND resolved_at IS NULL FOR UPDATE", (alert.id,)
            ).fetchone()
            if row is None:
                return False
            _keep_stored(alert, str(row[0]))
            cur = con.execute(
                "UPDATE cluster_alerts SET resolved_at = %s, doc = %s, hub_id = %s "
                "WHERE id = %s AND resolved_at IS NULL",
                (alert.resolved_at, alert_doc(alert), self.node.hub_id, alert.id),
            )
            if cur.rowcount == 0:
                return False
            _stamp(con, alert.id)
            return True

        with self.node.lock:
            return in_tx(self.node.con, write, self.node.counters)

    def save(self, alert: Alert) -> None:
        """Attach what the alert layer added to an alert (playbook results, acknowledgement) to its
        stored document, and the graver tier the owner's evaluation escalated it to (what every
        member shows, and what a member taking it over continues); the rest of the document (its
        state) is the owner's and stays."""
        held = self._held.saves
        if held is not None:
            held.append(alert)
        else:
            self.save_all([alert])

    def save_all(self, alerts: list[Alert]) -> None:
        """:meth:`save` for each alert, in one transaction; rows are locked in id order (an alert
        listed twice is saved as listed last)."""
        if not alerts:
            return
        last = {alert.id: alert for alert in alerts}

        def write(con: psycopg.Connection[Any]) -> None:
            for alert_id in sorted(last):
                alert = last[alert_id]
                row = con.execute(
                    "SELECT doc FROM cluster_alerts WHERE id = %s FOR UPDATE", (alert_id,)
                ).fetchone()
                if row is None:
                    continue
                doc = orjson.loads(row[0])
                doc["details"] = {
                    **(doc.get("details") or {}),
                    **{k: alert.details[k] for k in (*KEPT_DETAILS, ESCALATED_FROM) if k in alert.details},
                }
                doc["severity"] = graver(str(doc["severity"]), alert.severity)
                con.execute(
                    "UPDATE cluster_alerts SET doc = %s WHERE id = %s",
                    (orjson.dumps(doc, default=str).decode(), alert_id),
                )
                _stamp(con, alert_id)

        with self._read_lock:
            in_tx(self._read, write, self.node.counters)

    def firing_in(self, shards: set[int]) -> list[Alert]:
        """The alerts firing on these shards: what a hub taking them over continues."""
        with self.node.lock:
            rows = self.node.con.execute(
                "SELECT doc FROM cluster_alerts WHERE resolved_at IS NULL AND shard = ANY(%s) ORDER BY seq",
                (sorted(shards),),
            ).fetchall()
        alerts = [Alert(**orjson.loads(r[0])) for r in rows]
        self._join_incidents(alerts)
        return alerts

    def resolved_in(self, shards: set[int], since: float) -> list[Alert]:
        """The alerts of these shards resolved at ``since`` or later: what a hub taking them over
        checks for changes their last owner had not told."""
        with self.node.lock:
            rows = self.node.con.execute(
                "SELECT doc FROM cluster_alerts WHERE resolved_at >= %s AND shard = ANY(%s) ORDER BY seq",
                (since, sorted(shards)),
            ).fetchall()
        alerts = [Alert(**orjson.loads(r[0])) for r in rows]
        self._join_incidents(alerts)
        return alerts

    def _join_incidents(self, alerts: list[Alert]) -> None:
        """Give each alert the incident every member derives for it. A stored document is written
        before its incident exists, and routes group by incident: an alert continued without it
        would be resolved to receivers in another group than the one it fired in."""
        if not alerts:
            return
        incidents = self.view()[1]
        for alert in alerts:
            alert.incident = next((i.id for i in incidents if alert.id in i.members), alert.incident)

    def view(self) -> tuple[list[Alert], list[Incident]]:
        """Every alert of the cluster in the order they fired, and the incidents they form.

        The incidents are grouped here, by the same code a single hub runs as alerts fire, over
        the shared alerts and the places their owners recorded: every hub derives the same ones
        (and numbers them the same), whichever hub fired what."""
        with self._read_lock:
            rows = self._read.execute(
                "SELECT seq, doc, places, version FROM cluster_alerts WHERE version > %s ORDER BY version",
                (self._version,),
            ).fetchall()
            self.views += 1
            self.rows_read += len(rows)
            for seq, doc, places, version in rows:
                alert = Alert(**orjson.loads(doc))
                self._rows[int(seq)] = (alert, None if places is None else orjson.loads(places))
                self._version = max(self._version, int(version))
            ordered = sorted(self._rows.items(), key=lambda item: (item[1][0].started_at, item[0]))
            # copies: callers may change what they are given, the cache stays as stored
            alerts = [dataclasses.replace(a, details=dict(a.details)) for _, (a, _) in ordered]
            places_of = [p for _, (_, p) in ordered]
        tracker = IncidentTracker(self.incident_window, self.reopen_within)
        for alert, places in zip(alerts, places_of, strict=True):
            tracker.add(alert, places)
        return alerts, tracker.incidents()

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        """Alerts of the whole cluster, newest start first (what every hub's API answers)."""
        alerts = [a for a in reversed(self.view()[0]) if a.firing or not firing_only]
        return alerts[:limit]

    def close(self) -> None:
        with self._read_lock:
            self._read.close()
