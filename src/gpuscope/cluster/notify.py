"""Notifications of a cluster: rendered from the shared alerts, timed from what the outbox holds.

A single hub's dispatcher keeps its timing in memory; a cluster keeps it in ``cluster_outbox``,
whose rows carry their alert, kind and receiver in a unique key (``al-7/fired/pager/0``). What
was sent, and when, is therefore known to every hub, and anything sent twice would collide on
its key. Each transition is notified at once when it is written (:meth:`PgAlertState.fired`);
once a second one hub at a time (a transaction-level advisory lock) sweeps the firing alerts:

- a firing alert no longer muted (its silence expired) that a route's receiver was never told
  of is notified now, under the key it would have had when it fired;
- an alert that is neither acknowledged nor muted is told again after its route's
  ``repeat_interval`` since the last time;
- an escalation level whose ``after`` has passed is sent once (key ``al-7/escalation/0/...``),
  unless the alert was acknowledged; its resolution goes to that receiver too.

``group_wait`` and ``group_interval`` are not applied: each notification carries one alert.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import psycopg

from gpuscope.alert.labels import alert_labels, fingerprint
from gpuscope.alert.notify.base import AlertView, Notification, Request
from gpuscope.alert.routing import find_routes
from gpuscope.alert.service import alert_annotations
from gpuscope.cluster.membership import connect
from gpuscope.cluster.schema import NS_SWEEP
from gpuscope.counters import Counters
from gpuscope.model import Alert

if TYPE_CHECKING:
    from gpuscope.alert.service import AlertingService

log = logging.getLogger("gpuscope.cluster.notify")

#: (receiver, notifier kind, rendered requests)
Note = tuple[str, str, list[Request]]


def render(
    service: AlertingService,
    alert: Alert,
    now: float,
    counters: Counters,
    *,
    receivers: set[str] | None = None,
    escalation: int = 0,
) -> list[Note]:
    """One notification of ``alert`` as it is now per matching route (``receivers``: only those),
    or, with ``escalation`` = level + 1, to that level's receiver."""
    labels = alert_labels(alert)
    view = AlertView(
        id=alert.id,
        fingerprint=fingerprint(alert),
        status="firing" if alert.firing else "resolved",
        labels=labels,
        annotations=alert_annotations(alert),
        starts_at=alert.started_at,
        ends_at=alert.resolved_at,
        cost_per_hour=alert.cost_per_hour,
    )
    targets: list[tuple[str, str, dict[str, str]]] = []
    if escalation:
        targets.append(
            (service.settings.escalation[escalation - 1].receiver, f"escalation/{view.fingerprint}", {})
        )
    else:
        for route in find_routes(service.settings.routes, labels):
            if receivers is None or route.receiver in receivers:
                names = sorted(labels) if "..." in route.group_by else route.group_by
                targets.append(
                    (route.receiver, route.group_key(labels), {n: labels.get(n, "") for n in names})
                )
    notes: list[Note] = []
    for receiver, key, group in targets:
        notifier = service.settings.notifiers[receiver]
        note = Notification(receiver, key, group, [view], service.settings.external_url, escalation, now)
        try:
            notes.append((receiver, notifier.kind, notifier.render(note)))
        except (ValueError, TypeError, KeyError):
            counters.inc("notifications_render_failed")
            log.exception("rendering %s for %s failed", alert.id, receiver)
    return notes


def add_rows(con: psycopg.Connection[tuple[Any, ...]], dedup: str, notes: list[Note], now: float) -> int:
    """Queue notes under ``dedup/receiver/i`` keys; a key already queued is skipped. Returns how many
    rows were added."""
    added = 0
    for receiver, kind, requests in notes:
        for i, req in enumerate(requests):
            payload = orjson.dumps({"url": req.url, "body": req.body, "headers": req.headers}).decode()
            cur = con.execute(
                "INSERT INTO cluster_outbox (dedup, receiver, kind, payload, created_at, next_attempt_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (dedup) DO NOTHING",
                (f"{dedup}/{receiver}/{i}", receiver, kind, payload, now, now),
            )
            added += cur.rowcount
    if added:
        con.execute("SELECT pg_notify('gpuscope_outbox', '')")
    return added


def escalated_levels(con: psycopg.Connection[tuple[Any, ...]], alert_id: str) -> list[int]:
    rows = con.execute(
        "SELECT DISTINCT split_part(dedup, '/', 3)::int FROM cluster_outbox WHERE dedup LIKE %s",
        (f"{alert_id}/escalation/%",),
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


class Sweeper:
    """Mutes lifting, repeats and escalation for the whole cluster, run by one hub at a time."""

    def __init__(
        self,
        dsn: str,
        service: Callable[[], AlertingService | None],
        counters: Counters,
        every_s: float = 1.0,
    ) -> None:
        self.dsn = dsn
        self.service = service
        self.counters = counters
        self.every_s = every_s
        self._con: psycopg.Connection[tuple[Any, ...]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._escalated: list[tuple[str, str]] = []  # history to record once the sweep committed

    def sweep(self, now: float) -> int:
        """One pass over the firing alerts; returns how many notification rows it queued."""
        service = self.service()
        if service is None:
            return 0
        if self._con is None or self._con.closed:
            self._con = connect(self.dsn)
        con = self._con
        added = 0
        self._escalated.clear()
        with con.transaction():
            got = con.execute("SELECT pg_try_advisory_xact_lock(%s, 0)", (NS_SWEEP,)).fetchone()
            if not got or not got[0]:
                return 0  # another hub is sweeping
            docs = con.execute(
                "SELECT doc FROM cluster_alerts WHERE resolved_at IS NULL ORDER BY seq"
            ).fetchall()
            for (doc,) in docs:
                alert = Alert(**orjson.loads(doc))
                if service.dispatcher.mute_reason(alert, now) is not None:
                    continue
                added += self._alert(con, service, alert, now)
        for alert_id, detail in self._escalated:
            service.record(alert_id, "escalated", detail)
        self._escalated.clear()
        if added:
            self.counters.inc("cluster_notifications_swept", added)
        return added

    def _alert(
        self, con: psycopg.Connection[tuple[Any, ...]], service: AlertingService, alert: Alert, now: float
    ) -> int:
        last: dict[str, float] = {
            str(r[0]): float(r[1])
            for r in con.execute(
                "SELECT receiver, max(created_at) FROM cluster_outbox "
                "WHERE dedup LIKE %s OR dedup LIKE %s GROUP BY receiver",
                (f"{alert.id}/fired/%", f"{alert.id}/repeat/%"),
            ).fetchall()
        }
        acked = service.acked(alert)
        added = 0
        for route in find_routes(service.settings.routes, alert_labels(alert)):
            receiver = route.receiver
            repeat = service.settings.notifiers[receiver].timing(route.timing).repeat_interval
            if receiver not in last:  # muted when it fired, not any more
                added += add_rows(con, f"{alert.id}/fired", self._notes(service, alert, now, receiver), now)
            elif not acked and now - last[receiver] >= repeat:
                added += add_rows(
                    con, f"{alert.id}/repeat/{now:.3f}", self._notes(service, alert, now, receiver), now
                )
        if not acked:
            labels = alert_labels(alert)
            for i, level in enumerate(service.settings.escalation):
                if level.applies(labels, now - alert.started_at):
                    notes = render(service, alert, now, self.counters, escalation=i + 1)
                    got = add_rows(con, f"{alert.id}/escalation/{i}", notes, now)
                    if got:
                        self._escalated.append((alert.id, f"level {i + 1} to {level.receiver}"))
                    added += got
        return added

    def _notes(self, service: AlertingService, alert: Alert, now: float, receiver: str) -> list[Note]:
        return render(service, alert, now, self.counters, receivers={receiver})

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuscope-cluster-sweep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep(time.time())
            except psycopg.Error:
                self.counters.inc("cluster_sweep_errors")
                log.exception("cluster notification sweep failed")
                if self._con is not None:
                    self._con.close()
                self._con = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._con is not None:
            self._con.close()
            self._con = None


class ServiceNotes:
    """What a member's transitions tell receivers, from its alerting service's routes: written by
    :class:`~gpuscope.cluster.state.PgAlertState` in the transaction of the transition."""

    def __init__(self, service: AlertingService, counters: Counters) -> None:
        self.service = service
        self.counters = counters

    def fired(self, alert: Alert, now: float) -> list[Note]:
        """Triage first (its results go out with the alert); none for an alert muted as it fires:
        the sweep tells receivers once the mute lifts."""
        self.service.triage(alert)
        if self.service.dispatcher.mute_reason(alert, now) is not None:
            self.counters.inc("notifications_muted")
            return []
        return render(self.service, alert, now, self.counters)

    def resolved(self, alert: Alert, now: float) -> list[Note]:
        return render(self.service, alert, now, self.counters)

    def escalated(self, alert: Alert, now: float, level: int) -> list[Note]:
        return render(self.service, alert, now, self.counters, escalation=level + 1)

    def recorded(self, alert: Alert, what: str) -> None:
        self.counters.inc(f"cluster_alerts_{what}")
        self.service.record(alert.id, what, alert.summary)
