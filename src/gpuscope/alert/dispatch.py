"""From alert changes to notifications: routing, grouping and timing, muting, escalation.

Each alert is routed (:mod:`.routing`) into one group per matching route. A new group is sent after
its ``group_wait``; later changes (a new alert, a resolution) after ``group_interval`` from the last
send; an unchanged group with firing, unacknowledged alerts is re-sent every ``repeat_interval``.
Alerts muted by a silence, an open maintenance window or flapping are left out of notifications
(and counted); once the mute lifts while they still fire, they are sent at the next tick.
Rendered requests go to the persisted :class:`~gpuscope.alert.outbox.Outbox`, each with what it
tells; a cluster member's outbox keeps that as its ledger (:mod:`.ledger`), from which a member
taking over a shard continues the alerts' groups (:meth:`Dispatcher.continued`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuscope.alert.escalation import EscalationLevel
from gpuscope.alert.flap import FlapDetector
from gpuscope.alert.labels import alert_labels, fingerprint
from gpuscope.alert.ledger import Told
from gpuscope.alert.maintenance import MaintenanceWindow
from gpuscope.alert.notify.base import AlertView, Notification, Notifier
from gpuscope.alert.outbox import About, Outbox
from gpuscope.alert.routing import Route, Timing, find_routes
from gpuscope.alert.silences import Silences
from gpuscope.counters import Counters
from gpuscope.model import Alert, Labels

Annotate = Callable[[Alert], dict[str, str]]
Record = Callable[[str, str, str], None]


def default_annotations(alert: Alert) -> dict[str, str]:
    return {"summary": alert.summary, "cost_per_hour": f"{alert.cost_per_hour:.2f}"}


@dataclass(slots=True)
class _Group:
    key: str
    receiver: str
    route: str  # the path of the route that made it: an alert is in one group per route
    labels: dict[str, str]
    timing: Timing
    created_at: float
    members: dict[str, Alert] = field(default_factory=dict)
    notified: set[str] = field(default_factory=set)  # ids the receiver was last told are firing
    #: notified ids that reached a graver tier since: told again with the group's next changes
    regraded: set[str] = field(default_factory=set)
    last_sent: float | None = None


class Dispatcher:
    def __init__(
        self,
        routes: list[Route],
        notifiers: dict[str, Notifier],
        outbox: Outbox,
        *,
        silences: Silences,
        windows: list[MaintenanceWindow] | None = None,
        flap: FlapDetector | None = None,
        escalation: list[EscalationLevel] | None = None,
        acked: Callable[[Alert], bool] = lambda _alert: False,
        annotate: Annotate = default_annotations,
        record: Record = lambda _id, _what, _detail: None,
        counters: Counters | None = None,
        external_url: str = "",
    ) -> None:
        self.routes = routes
        self.notifiers = notifiers
        self.outbox = outbox
        self.silences = silences
        self.windows = windows or []
        self.flap = flap or FlapDetector()
        self.escalation = escalation or []
        self.acked = acked
        self.annotate = annotate
        self.record = record
        self.counters = counters or Counters()
        self.external_url = external_url
        self._groups: dict[tuple[str, str], _Group] = {}
        self._escalated: dict[str, set[int]] = {}  # alert id -> escalation levels sent
        self._firing: dict[str, Alert] = {}

    # -- input --------------------------------------------------------------------------------

    def fired(self, alert: Alert, now: float, heard_at: float | None = None) -> None:
        """``heard_at``: when the alert fired, if before ``now`` (it waited for triage): a new
        group's ``group_wait`` counts from then."""
        self.flap.fired(alert)
        self._route(alert, now, heard_at)

    def _route(
        self, alert: Alert, now: float, heard_at: float | None = None, was: dict[str, _Group] | None = None
    ) -> None:
        """``was``: an escalated alert's groups before, by route (see :meth:`escalated`)."""
        self._firing[alert.id] = alert
        groups = self._join(alert, now if heard_at is None else min(heard_at, now))
        if not groups:
            self.counters.inc("alerts_unrouted")
            self.record(alert.id, "unrouted", "no route matches its labels")
        left = self._regrade(alert.id, groups, was) if was else []
        # only the alert's own groups: the others are the clock's, flushed every second (all of
        # them per alert made a burst of N alerts cost N x N group flushes)
        self._flush_groups(groups + left, now)

    def _join(self, alert: Alert, now: float) -> list[_Group]:
        """Put an alert into the group of each route it matches; returns those groups."""
        labels = alert_labels(alert)
        groups: list[_Group] = []
        for route in find_routes(self.routes, labels):
            notifier = self.notifiers[route.receiver]
            gkey = route.group_key(labels)
            group = self._groups.get((route.receiver, gkey))
            if group is None:
                names = sorted(labels) if "..." in route.group_by else route.group_by
                group = _Group(
                    gkey,
                    route.receiver,
                    route.path,
                    {n: labels.get(n, "") for n in names},
                    notifier.timing(route.timing),
                    now,
                )
                self._groups[(route.receiver, gkey)] = group
            group.members[alert.id] = alert
            groups.append(group)
        return groups

    def continued(self, alert: Alert, now: float, told: Told) -> None:
        """Take over a firing alert another hub dispatched: receivers it told are not told again
        (their repeat is timed from then), those it did not tell are told after ``group_wait``,
        those it told at a lesser tier than the alert's are told the graver one after
        ``group_interval`` (as :meth:`escalated` tells them), and escalation levels it sent are
        not sent again."""
        if alert.id in self._firing:
            return
        self._firing[alert.id] = alert
        if told.escalated:
            self._escalated[alert.id] = set(told.escalated)
        for group in self._join(alert, now):
            when = told.firing.get(group.receiver)
            if when is not None:
                group.notified.add(alert.id)
                if told.escalation_owed(group.receiver, alert.severity):
                    group.regraded.add(alert.id)
                group.last_sent = when if group.last_sent is None else max(group.last_sent, when)

    def forget(self, gone: Callable[[Labels], bool]) -> int:
        """Drop, without telling anyone, the alerts whose entities another hub now dispatches."""
        ids = {i for i, a in self._firing.items() if gone(a.entity)}
        for alert_id in ids:
            del self._firing[alert_id]
            self._escalated.pop(alert_id, None)
        for gid, group in list(self._groups.items()):
            for alert_id in ids & group.members.keys():
                del group.members[alert_id]
                group.notified.discard(alert_id)
                group.regraded.discard(alert_id)
            if not group.members:
                del self._groups[gid]
        return len(ids)

    def escalated(self, alert: Alert, now: float, heard_at: float | None = None) -> None:
        """The alert reached a graver tier: route it again (a graver tier may reach other
        receivers). A group that told it fires owes the graver tier and tells it with its next
        changes (``group_interval`` after its last send); a group that did not tell it yet tells
        it as new. Receivers told it fires still count as told (it is theirs to be told
        resolved, should it resolve first).

        A route that groups by a label the tier changed (``group_by: ["..."]``, or ``severity``
        or ``tier`` named) moves the alert to its new group rather than have both groups tell
        it: the escalation keeps the alert's identity, so one group per route tells its graver
        tier and, later, its resolution, and the old group forgets it untold. The new group
        tells it when the old one would have (as :meth:`continued` tells an escalation a
        departed owner owed), the receiver being told each tier once; a route that split by
        tier on purpose sees the alert under its new tier from then on."""
        was = {g.route: g for g in self._groups.values() if alert.id in g.members}
        self._route(alert, now, heard_at, was)

    def _regrade(self, alert_id: str, groups: list[_Group], was: dict[str, _Group]) -> list[_Group]:
        """An escalated alert's groups now (``groups``) and before (``was``): those told it fires
        owe the graver tier; a route's new group takes it from the old. Returns the old groups
        of routes that no longer take it (they still owe it)."""
        left = dict(was)
        for group in groups:
            old = left.pop(group.route, None)
            if old is not None and old is not group:
                self._move(alert_id, old, group)
            elif old is not None and alert_id in group.notified:
                group.regraded.add(alert_id)
        for group in left.values():
            if alert_id in group.notified:
                group.regraded.add(alert_id)
        return list(left.values())

    def _move(self, alert_id: str, old: _Group, new: _Group) -> None:
        """Take an escalated alert out of its route's old group, untold, into the new one."""
        told = old.last_sent if alert_id in old.notified else None
        del old.members[alert_id]
        old.notified.discard(alert_id)
        old.regraded.discard(alert_id)
        if not old.members:
            self._groups.pop((old.receiver, old.key), None)
        if told is not None:
            new.notified.add(alert_id)
            new.regraded.add(alert_id)
            if new.last_sent is None:
                new.last_sent = told
        elif new.last_sent is None:  # not told yet: no later than the old group's group_wait
            new.created_at = min(new.created_at, old.created_at)

    def resolved(self, alert: Alert, now: float) -> None:
        self._firing.pop(alert.id, None)
        groups = [g for g in self._groups.values() if alert.id in g.members]
        for group in groups:
            group.members[alert.id] = alert  # it may have gone out as it fired (a copy)
        for level in sorted(self._escalated.pop(alert.id, set())):
            self._send(self.escalation[level].receiver, "", {}, [self._view(alert)], now, level + 1)
        self._flush_groups(groups, now)

    # -- muting -------------------------------------------------------------------------------

    def mute_reason(self, alert: Alert, now: float) -> str | None:
        """Why an alert is kept from receivers now (None: it is not)."""
        labels = alert_labels(alert)
        silence = self.silences.muting(labels, now)
        if silence is not None:
            return f"silenced by {silence.id}"
        window = next((w for w in self.windows if w.mutes(labels, now)), None)
        if window is not None:
            return f"maintenance window {window.name}"
        if self.flap.flapping(alert, now):
            return "flapping"
        return None

    # -- output -------------------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Send every group that is due, and escalate what waited too long."""
        self._flush_groups(list(self._groups.values()), now)
        self._escalate(now)

    def _flush_groups(self, groups: list[_Group], now: float) -> None:
        for group in groups:
            self._flush_group(group, now)
            if not group.members:
                self._groups.pop((group.receiver, group.key), None)

    def _flush_group(self, group: _Group, now: float) -> None:
        # One reading of each member's end for the whole flush: the alert engine sets
        # ``resolved_at`` on these objects from the evaluator thread while the clock thread
        # flushes, and an alert read firing by one pass and resolved by the next was told
        # resolved twice in one notification, or told "resolved" in its first one and never
        # "firing" (issue 13 (c)). An end read after this flush began waits for the next one.
        ended = {alert_id: alert.resolved_at for alert_id, alert in group.members.items()}
        visible: list[Alert] = []
        for alert in group.members.values():
            if ended[alert.id] is not None:
                continue
            reason = self.mute_reason(alert, now)
            if reason is None:
                visible.append(alert)
            elif alert.id not in group.notified:
                self.counters.inc("notifications_muted")
        resolved = [a for a in group.members.values() if ended[a.id] is not None and a.id in group.notified]
        new = [a for a in visible if a.id not in group.notified or a.id in group.regraded]
        t = group.timing
        if group.last_sent is None:
            due = now >= group.created_at + t.group_wait
        elif new or resolved:
            due = now >= group.last_sent + t.group_interval
        else:
            due = (
                bool(group.notified)
                and now >= group.last_sent + t.repeat_interval
                and any(not self.acked(a) for a in visible)
            )
        if due and (new or resolved or group.notified):
            views = [self._view(replace(a, resolved_at=ended[a.id])) for a in visible + resolved]
            if views:
                self._send(group.receiver, group.key, group.labels, views, now, 0)
                group.last_sent = now
                group.notified = {a.id for a in visible} | {
                    i for i in group.notified if ended.get(i, 0.0) is None
                }
                group.regraded -= {a.id for a in visible}
        for alert_id, end in ended.items():
            if end is None:
                continue
            if alert_id in group.notified and due:
                group.notified.discard(alert_id)
            if alert_id not in group.notified:
                del group.members[alert_id]
                group.regraded.discard(alert_id)

    def _escalate(self, now: float) -> None:
        if not self.escalation:
            return
        for alert in list(self._firing.values()):
            if self.acked(alert) or self.mute_reason(alert, now) is not None:
                continue
            labels = alert_labels(alert)
            sent = self._escalated.setdefault(alert.id, set())
            for i, level in enumerate(self.escalation):
                if i not in sent and level.applies(labels, now - alert.started_at):
                    sent.add(i)
                    self.record(alert.id, "escalated", f"level {i + 1} to {level.receiver}")
                    self._send(level.receiver, "", {}, [self._view(alert)], now, i + 1)

    def _view(self, alert: Alert) -> AlertView:
        return AlertView(
            id=alert.id,
            fingerprint=fingerprint(alert),
            status="firing" if alert.firing else "resolved",
            labels=alert_labels(alert),
            annotations=self.annotate(alert),
            starts_at=alert.started_at,
            ends_at=alert.resolved_at,
            cost_per_hour=alert.cost_per_hour,
        )

    def _send(
        self,
        receiver: str,
        group_key: str,
        group_labels: dict[str, str],
        views: list[AlertView],
        now: float,
        escalation: int,
    ) -> None:
        notifier = self.notifiers[receiver]
        key = group_key or f"escalation/{views[0].fingerprint}"
        n = Notification(receiver, key, group_labels, views, self.external_url, escalation, now)
        try:
            requests = notifier.render(n)
        except (ValueError, TypeError, KeyError) as exc:  # a template bug must not stop the others
            self.counters.inc("notifications_render_failed")
            self.record(views[0].id, "render_failed", f"{receiver}: {exc}")
            return
        about = About(tuple((v.id, v.status, v.labels["severity"]) for v in views), escalation)
        self.outbox.enqueue(receiver, notifier.kind, requests, now, about)
        for v in views:
            self.record(
                v.id, f"notified_{v.status}", receiver + (f" (escalation {escalation})" if escalation else "")
            )

    def pending_groups(self) -> int:
        return len(self._groups)
