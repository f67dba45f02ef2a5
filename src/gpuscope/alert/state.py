"""Where alert transitions are recorded and read back: the seam between deciding and keeping.

The :class:`~gpuscope.alert.engine.AlertEngine` decides what fires and what resolves from
findings; an :class:`AlertState` records each transition and answers what the alerting API,
acknowledgements and playbooks see. One hub keeps them in memory and its store
(:class:`LocalAlertState`); the members of a sharded cluster share them in PostgreSQL
(:class:`gpuscope.cluster.state.PgAlertState`), so every member answers the same.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from gpuscope.alert.incidents import Incident, IncidentTracker
from gpuscope.counters import Counters
from gpuscope.model import Alert, Labels
from gpuscope.store.base import Store

_ALL = 1_000_000
#: alerts one hub holds in memory (firing ones always, and the newest ended incidents)
KEEP_ALERTS = 10_000


class AlertState(Protocol):
    """Records alert transitions and reads them back."""

    def next_id(self) -> str:
        """The id of the next alert to fire."""
        ...

    def fired(self, alert: Alert, places: list[Labels] | None, now: float) -> Alert | None:
        """Record a fired alert (``places``: where a job or service alert runs, for incidents).
        Returns the alert another hub already fires on the same rule and entity, to continue
        instead (then this one is not recorded)."""
        ...

    def resolved(self, alert: Alert, now: float) -> bool:
        """Record a resolution; False when it was already resolved elsewhere."""
        ...

    def continued(self, alerts: list[Alert]) -> None:
        """Alerts fired earlier (before a restart, or by another hub) are continued here."""
        ...

    def save(self, alert: Alert) -> None:
        """Keep what the alert layer attached to an alert (playbook results, acknowledgement)."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Record the transitions of one evaluation together: what this thread records inside the
        block is kept, in one write where the backend allows, by the time the block ends (before
        anyone is told of them)."""
        ...

    def resumed(self) -> list[Alert]:
        """At start: the alerts that were firing when the hub stopped, to continue (new ids follow
        the stored ones)."""
        ...

    def view(self) -> tuple[list[Alert], list[Incident]]:
        """Every alert in the order they fired, and the incidents they form."""
        ...

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        """Stored alerts, newest start first (also those of earlier runs of the hub)."""
        ...


class _Held(threading.local):
    """The alerts a thread's open :meth:`LocalAlertState.batch` will save (None: no batch)."""

    alerts: list[Alert] | None = None


class LocalAlertState:
    """One hub's alerts: in memory, grouped into incidents as they fire, saved to its store.

    Memory holds at most about ``keep`` alerts: past that, the oldest incidents that have ended
    (every alert resolved, too long ago to take new members) are forgotten, counted in
    ``alerts_forgotten``; their alerts stay in the store, where :meth:`alerts` reads. Firing alerts
    are never forgotten. Its own lock lets readers (the API, a playbook run inside an evaluation)
    see a consistent view."""

    def __init__(
        self,
        store: Store | None = None,
        incident_window: float = 600.0,
        *,
        keep: int = KEEP_ALERTS,
        counters: Counters | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1 alert, got {keep}")
        self.store = store
        self.incident_window = incident_window
        self.keep = keep
        self.counters = counters or Counters()
        self._alerts: list[Alert] = []
        self._incidents = IncidentTracker(incident_window)
        #: the number of the last alert id handed out (a restarted hub continues after its stored ones)
        self.last = 0
        self._lock = threading.Lock()
        #: per thread: an acknowledgement saved from an API thread during an evaluation is not held
        self._held = _Held()

    def next_id(self) -> str:
        self.last += 1
        return f"al-{self.last}"

    def fired(self, alert: Alert, places: list[Labels] | None, now: float) -> Alert | None:
        with self._lock:
            self._alerts.append(alert)
            self._incidents.add(alert, places)
            if len(self._alerts) > self.keep:
                self._forget(now)
        self.save(alert)
        return None

    def _forget(self, now: float) -> None:
        # a tenth of `keep` below the bound at once, so that the scan runs once per many alerts
        excess = len(self._alerts) - self.keep + self.keep // 10
        gone = self._incidents.forget(now - self._incidents.reopen_within, excess)
        if gone:
            ids = {id(a) for a in gone}
            self._alerts = [a for a in self._alerts if id(a) not in ids]
            self.counters.inc("alerts_forgotten", len(gone))

    def resolved(self, alert: Alert, now: float) -> bool:
        self.save(alert)
        return True

    def continued(self, alerts: list[Alert]) -> None:
        with self._lock:
            for alert in alerts:
                self._alerts.append(alert)
                self._incidents.add(alert, None)

    def save(self, alert: Alert) -> None:
        held = self._held.alerts
        if held is not None:
            held.append(alert)
        elif self.store is not None:
            self.store.save_alert(alert)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Save what is recorded inside the block in one store write when it ends, also when it
        ends by an exception (what fired before it is in memory, so it is kept)."""
        if self._held.alerts is not None:  # nested: the outer block saves
            yield
            return
        held: list[Alert] = []
        self._held.alerts = held
        try:
            yield
        finally:
            self._held.alerts = None
            if held and self.store is not None:
                self.store.save_alerts(held)

    def resumed(self) -> list[Alert]:
        if self.store is None:
            return []
        stored = self.store.alerts(limit=_ALL)
        numbers = [int(a.id[3:]) for a in stored if a.id.startswith("al-") and a.id[3:].isdecimal()]
        self.last = max([self.last, *numbers])
        return [a for a in stored if a.firing]

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        if self.store is not None:
            # the store holds an alert as it was at its last transition (fired, escalated,
            # resolved); memory holds it as its last evaluation left it (value, summary, details
            # follow the condition): where both have it, memory's is the one the pages show
            stored = self.store.alerts(firing_only, limit)
            with self._lock:
                live = {a.id: a for a in self._alerts}
            return [live.get(a.id, a) for a in stored]
        newest = sorted(self.view()[0], key=lambda a: a.started_at, reverse=True)
        return [a for a in newest if a.firing or not firing_only][:limit]

    def view(self) -> tuple[list[Alert], list[Incident]]:
        with self._lock:
            return list(self._alerts), self._incidents.incidents()
