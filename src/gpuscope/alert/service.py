"""The alerting service of a running hub: triage, acknowledgement, silences and notification.

It listens to the hub's alert changes (fired, escalated, resolved) and only queues them, with
the time they happened (:mod:`.triagequeue`): the evaluation that produced them goes on at once.
Its threads:

- the triage worker takes the changes in order, a pass at a time: a fired alert gets its playbook
  run and attached (the pass's playbooks saved in one store write), then is recorded in the
  history and routed to receivers; a resolution or escalation is recorded and routed in its turn;
- the clock, every second, re-evaluates timing, mutes and escalation, and dispatches without
  their playbooks the alerts that waited past the triage budget;
- the outbox thread delivers.

``drain`` waits until every change heard so far is dispatched (tests, and a stopping hub).
``sim-eval`` does not attach the service, so evaluation in virtual time is unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import orjson

from gpuscope.alert.checks import Reads
from gpuscope.alert.dispatch import Dispatcher
from gpuscope.alert.engine import ESCALATED_FROM, WORSENED, AlertChange, AlertEngine
from gpuscope.alert.flap import FlapDetector
from gpuscope.alert.labels import Matcher, alert_labels, fingerprint
from gpuscope.alert.ledger import DispatchLedger, MemoryLedger, Told
from gpuscope.alert.outbox import Outbox, OutboxBackend, Sender
from gpuscope.alert.playbooks import PLAYBOOKS
from gpuscope.alert.settings import AlertingSettings
from gpuscope.alert.silences import Silence, Silences, new_silence, parse_config_silences
from gpuscope.alert.statedb import Connection, StateBackend, StateDB
from gpuscope.alert.triage import run_playbook
from gpuscope.alert.triagequeue import BUDGET_S, QUEUE_SIZE, Job, TriageQueue
from gpuscope.counters import Counters
from gpuscope.model import Alert, Labels
from gpuscope.rules import RULES
from gpuscope.store.base import Store

log = logging.getLogger("gpuscope.alert.service")


def alert_annotations(alert: Alert) -> dict[str, str]:
    """What receivers see beside the labels: summary, cost, and the playbook's first answers
    (its fixed parts only, when the alert was dispatched before its playbook ran)."""
    out = {"summary": alert.summary, "cost_per_hour": f"{alert.cost_per_hour:.2f}"}
    book = alert.details.get("playbook")
    if isinstance(book, dict):
        out["meaning"] = str(book.get("meaning", ""))
        out["impact"] = str(book.get("impact", ""))
        if book.get("summary"):
            out["diagnosis"] = str(book["summary"])
        if book.get("mitigation"):
            out["mitigation"] = str(book["mitigation"][0])
    elif alert.rule in PLAYBOOKS:
        fixed = PLAYBOOKS[alert.rule]
        out["meaning"] = RULES[alert.rule].meaning
        out["impact"] = fixed.impact
        if fixed.mitigation:
            out["mitigation"] = fixed.mitigation[0]
    return out


class AlertSource(Protocol):
    """What alerting needs of a hub: its alert changes, its alert state, and the store that
    playbooks read and alerts are saved to."""

    @property
    def store(self) -> Store: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def alerts(self) -> AlertEngine: ...

    def firing(self) -> list[Alert]: ...

    def save_alert(self, alert: Alert) -> None: ...

    def attach_all(self, attached: Sequence[tuple[Alert, str, Any]]) -> None: ...

    def add_listener(self, listener: Callable[[AlertChange], None]) -> None: ...


class AlertingService:
    def __init__(
        self,
        hub: AlertSource,
        settings: AlertingSettings,
        *,
        db: StateBackend | None = None,
        sender: Sender | None = None,
        clock: Callable[[], float] = time.time,
        tick_interval: float = 1.0,
        outbox: OutboxBackend | None = None,
        ledger: DispatchLedger | None = None,
        triage_queue: int = QUEUE_SIZE,
        triage_budget: float = BUDGET_S,
    ) -> None:
        """``outbox`` and ``ledger``: where notifications wait and what was sent is read back
        (default: this hub's state database and memory; a cluster member's: PostgreSQL).
        ``triage_queue`` and ``triage_budget``: the bounds of :mod:`.triagequeue`."""
        self.hub = hub
        self.settings = settings
        self.clock = clock
        self.tick_interval = tick_interval
        self.db: StateBackend = db or StateDB(settings.state_path or ":memory:")
        self.counters = hub.counters
        self.silences = Silences(self.db)
        for silence in parse_config_silences(settings.silences, clock()):
            self.silences.add(silence)
        self._acks: dict[str, dict[str, Any]] = {
            str(fp): orjson.loads(doc) for fp, doc in self.db.query("SELECT alert_id, doc FROM acks")
        }
        self.ledger: DispatchLedger = ledger if ledger is not None else MemoryLedger()
        self.outbox = Outbox(
            self.db,
            backend=outbox,
            sender=sender,
            counters=self.counters,
            base_backoff=settings.base_backoff,
            max_backoff=settings.max_backoff,
            max_age=settings.max_age,
            clock=clock,
        )
        self.dispatcher = Dispatcher(
            settings.routes,
            settings.notifiers,
            self.outbox,
            silences=self.silences,
            windows=settings.windows,
            flap=FlapDetector(settings.flap_threshold, settings.flap_window),
            escalation=settings.escalation,
            acked=self.acked,
            annotate=alert_annotations,
            record=self.record,
            counters=self.counters,
            external_url=settings.external_url,
        )
        # the dispatcher's lock; taken after the queue's order lock, never before it
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.queue = TriageQueue(
            self._triage,
            self._attach,
            self._dispatch,
            size=triage_queue,
            budget=triage_budget,
            counters=self.counters,
        )
        self._reads: Reads | None = None  # the store's answers the playbooks of a burst share
        self._firing: list[Alert] = []
        self._firing_ids: set[str] = set()
        hub.add_listener(self.on_change)

    # -- the hub's listener -------------------------------------------------------------------

    def on_change(self, change: AlertChange) -> None:
        """Queue the change with the time it happened: its history row, triage and dispatch
        happen off the evaluation (a history row is a write to the state database)."""
        self.queue.put(change, self.clock())

    def _triage(self, job: Job) -> dict[str, Any]:
        alert = job.change.alert
        if self._reads is None or not self._reads.fresh():
            self._reads = Reads(self.hub.store)
            self._firing_ids = set()
        if alert.id not in self._firing_ids:  # fired after the list was read
            self._firing = self.hub.firing()
            self._firing_ids = {a.id for a in self._firing}
        return run_playbook(alert, self._reads, alert.started_at, self._firing, self.counters)

    def _attach(self, found: list[tuple[Job, Any]]) -> None:
        """The playbooks of one pass of the triage worker, attached and saved in one store write."""
        self.hub.attach_all([(job.change.alert, "playbook", book) for job, book in found])

    def _dispatch(self, job: Job, skipped: str) -> None:
        alert, kind = job.change.alert, job.change.kind
        if kind == "escalated":
            told = (alert.details.get(WORSENED) or [{}])[-1]
            was = told.get("from", alert.details.get(ESCALATED_FROM))
            # a stage of worsening at the same tier is told by what it became
            detail = f"{was} -> {alert.severity}" if was != alert.severity else f"worse: {alert.summary}"
        else:
            detail = alert.summary
        self.record(alert.id, kind, detail, job.heard_at)
        if skipped:
            self.record(alert.id, "triage_skipped", skipped)
        with self._lock:
            now = self.clock()
            if job.change.kind == "fired":
                # resolved while it waited: receivers are told it fired, then (its resolution
                # being queued behind) that it resolved
                as_fired = alert if alert.firing else replace(alert, resolved_at=None)
                self.dispatcher.fired(as_fired, now, job.heard_at)
            elif job.change.kind == "escalated":
                self.dispatcher.escalated(alert, now, job.heard_at)
            else:
                self.dispatcher.resolved(alert, now)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every change heard so far was triaged and dispatched (without a running
        worker: do it in this thread); False when ``timeout`` ran out first."""
        return self.queue.drain(timeout)

    def triage_stats(self) -> dict[str, float]:
        """The triage queue: changes waiting, the oldest wait, and the queue's bounds."""
        return {**self.queue.stats(), "size": self.queue.size, "budget_seconds": self.queue.budget}

    def continued(self, alerts: list[Alert]) -> None:
        """Firing alerts this hub takes over from another: dispatched on from what was sent."""
        now = self.clock()
        with self._lock:
            for alert in alerts:
                self.dispatcher.continued(alert, now, self.ledger.told(alert.id))

    def continued_resolved(self, alerts: list[Alert]) -> int:
        """Alerts another hub resolved in the shards this hub takes over: tell what their last
        owner had not told when it died or let the shard go (its queue and groups are gone with
        it). An alert it never dispatched (no ``fired`` in its history) is dispatched as it fired,
        then resolved, as a single hub tells an alert that resolved while it waited; a receiver
        told it fires and not yet that it resolved is told so (after its group's
        ``group_interval``). Returns how many alerts had something left to tell."""
        now = self.clock()
        resolved = [alert for alert in alerts if not alert.firing]
        if not resolved:
            return 0
        ids = [alert.id for alert in resolved]
        dispatched: set[str] = set()
        for at in range(0, len(ids), 1000):  # bound the statement's parameters
            chunk = tuple(ids[at : at + 1000])
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT DISTINCT alert_id FROM history WHERE what = 'fired' AND alert_id IN ({marks})"
            dispatched.update(str(row[0]) for row in self.db.query(sql, chunk))
        told_of = self.ledger.told_many([i for i in ids if i in dispatched])
        owed = 0
        for alert in resolved:
            if alert.id not in dispatched:
                for kind in ("fired", "resolved"):
                    self._dispatch(Job(AlertChange(kind, alert), alert.started_at, 0.0), "")
                owed += 1
                continue
            told = told_of.get(alert.id, Told())
            if not told.resolution_owed():
                continue
            with self._lock:
                self.dispatcher.continued(replace(alert, resolved_at=None), now, told)
            self._dispatch(Job(AlertChange("resolved", alert), now, 0.0), "")
            owed += 1
        return owed

    def forget(self, gone: Callable[[Labels], bool]) -> int:
        """Stop dispatching the alerts of entities another hub now owns (it continues them, and
        tells what this hub had not yet dispatched)."""
        self.queue.forget(gone)
        with self._lock:
            return self.dispatcher.forget(gone)

    def tick(self, now: float | None = None) -> None:
        """Timing, mutes lifting, repeats and escalation, and alerts that waited past the triage
        budget; called every second by the clock thread."""
        self.queue.shed_late()
        now = self.clock() if now is None else now
        with self._lock:
            self.dispatcher.flush(now)
            self.dispatcher.flap.forget_old(now)

    # -- acknowledgement, silences, history ---------------------------------------------------

    def _ack_of(self, alert: Alert) -> dict[str, Any] | None:
        """The acknowledgement of an alert; re-read when other hubs may have written it."""
        fp = fingerprint(alert)
        if self.db.shared:
            rows = self.db.query("SELECT doc FROM acks WHERE alert_id = ?", (fp,))
            return dict(orjson.loads(rows[0][0])) if rows else None
        return self._acks.get(fp)

    def acked(self, alert: Alert) -> bool:
        return self._ack_of(alert) is not None

    def ack(self, target: str, by: str, comment: str = "") -> list[Alert]:
        """Acknowledge an alert (``al-N``) or every firing alert of an incident (``inc-N``)."""
        # rows are taken in one order (their key's) by every hub: two acknowledgements of
        # overlapping incidents cannot lock each other's rows in opposite orders
        alerts = sorted(self._resolve_target(target), key=fingerprint)
        now = self.clock()
        doc = {"by": by, "comment": comment, "at": now}
        text = orjson.dumps(doc).decode()

        def write(con: Connection) -> None:
            for alert in alerts:
                con.execute("INSERT OR REPLACE INTO acks VALUES (?, ?)", (fingerprint(alert), text))
                self._history(con, now, alert.id, "acknowledged", f"by {by}: {comment}".rstrip(": "))

        with self._lock:
            self.db.transact(write)
            for alert in alerts:
                self._acks[fingerprint(alert)] = doc
                alert.details["ack"] = doc
        with self.hub.alerts.state.batch():  # an incident's alerts in one store write
            for alert in alerts:
                self.hub.save_alert(alert)
        return alerts

    def _resolve_target(self, target: str) -> list[Alert]:
        if target.startswith("inc-"):
            incident = next((i for i in self.hub.alerts.incidents() if i.id == target), None)
            if incident is None:
                raise KeyError(target)
            members = [a for a in self.hub.alerts.all() if a.id in set(incident.members) and a.firing]
            return members
        alert = self.hub.alerts.get(target)
        if alert is None:
            raise KeyError(target)
        return [alert]

    def silence(
        self,
        matchers: list[Matcher],
        duration: float,
        by: str,
        comment: str = "",
        starts_at: float | None = None,
    ) -> Silence:
        silence = new_silence(
            matchers, self.clock(), duration=duration, starts_at=starts_at, created_by=by, comment=comment
        )
        with self._lock:
            return self.silences.add(silence)

    def expire_silence(self, silence_id: str) -> Silence:
        with self._lock:
            return self.silences.expire(silence_id, self.clock())

    def record(self, alert_id: str, what: str, detail: str, ts: float | None = None) -> None:
        with self.db.tx() as con:
            self._history(con, self.clock() if ts is None else ts, alert_id, what, detail)

    @staticmethod
    def _history(con: Any, now: float, alert_id: str, what: str, detail: str) -> None:
        con.execute(
            "INSERT INTO history (ts, alert_id, what, detail) VALUES (?, ?, ?, ?)",
            (now, alert_id, what, detail),
        )

    def history(self, alert_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        where, params = ("WHERE alert_id = ?", (alert_id, limit)) if alert_id else ("", (limit,))
        rows = self.db.query(
            f"SELECT ts, alert_id, what, detail FROM history {where} ORDER BY seq DESC LIMIT ?", params
        )
        return [{"ts": ts, "alert": a, "what": w, "detail": d} for ts, a, w, d in reversed(rows)]

    def status(self, alert: Alert) -> dict[str, Any]:
        """How the alerting layer treats an alert now: muted (why), acknowledged (by whom)."""
        now = self.clock()
        return {
            "labels": alert_labels(alert),
            "muted": self.dispatcher.mute_reason(alert, now) if alert.firing else None,
            "ack": self._ack_of(alert),
        }

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        self.outbox.start()
        self.queue.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuscope-alerting", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_interval):
            try:
                self.tick()
            except Exception:
                self.counters.inc("alerting_tick_errors")
                log.exception("alerting tick failed")

    def stop(self) -> None:
        """What fired is triaged and dispatched first (bounded: :data:`.triagequeue.STOP_DRAIN_S`),
        then the clock, the outbox and the state database stop."""
        self.queue.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.outbox.stop()
        self.db.close()


def default_state_path(storage_path: str) -> str:
    return ":memory:" if storage_path == ":memory:" else str(Path(storage_path).with_suffix(".alerts.sqlite"))
