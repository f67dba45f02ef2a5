"""From findings to alerts: one alert per (rule, entity) while its finding persists.

A rule may have a pending time (``pending_for``): its condition must hold that long before the
alert fires (pending → firing → resolved); ``started_at`` is the time it fired. Hard-fault rules
never wait. Detectors restate every condition that holds at each evaluation; this layer turns a
finding that appears into a fired alert and one that has been absent for ``resolve_after``
seconds into a resolved one (a short absence is treated as the same alert, so a condition at its
threshold does not flap). A later re-occurrence is a new alert. A firing alert follows its
condition: each evaluation refreshes its value, summary and cost, and a finding that reaches a
graver tier than the alert's, or a later stage of worsening (:attr:`Finding.stage`: a second cause
inside the alert), escalates it (an ``escalated`` change, notified again, and recorded in
``details["worsened"]``); an alert never de-escalates. Severity and owner come from
:mod:`gpuscope.rules`; the cost of delay is ``affected_gpus x price_per_gpu_hour x work_at_risk``.
It knows nothing of where findings came from, and records what it decides in an
:class:`~gpuscope.alert.state.AlertState` (this hub's memory and store, or a cluster's PostgreSQL).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuscope.alert.incidents import Incident
from gpuscope.alert.state import AlertState, LocalAlertState
from gpuscope.model import Alert, Finding, Labels
from gpuscope.rules import RULES, TIERS

ChangeKind = Literal["fired", "escalated", "resolved"]
FindingKey = tuple[str, tuple[tuple[str, str], ...]]
Places = Callable[[Labels], list[Labels]]

#: ``details`` keys the alert layer attaches itself; a detector's refresh must not wipe them.
KEPT_DETAILS = ("playbook", "ack", "pending_since")
#: the ``details`` key of the tier an escalated alert had before (kept by refreshes as well)
ESCALATED_FROM = "escalated_from"
#: the ``details`` key of an alert's escalations while it fired, oldest first: each its time,
#: tier before and after, value, summary and stage (kept by refreshes as well)
WORSENED = "worsened"
#: the ``details`` key of the stage of worsening an alert fired at, when it was past the first
FIRED_STAGE = "fired_stage"


@dataclass(frozen=True, slots=True)
class AlertChange:
    kind: ChangeKind
    alert: Alert


def _check(finding: Finding) -> None:
    """Refuse a malformed finding, naming the rule and what is wrong: it is a detector's bug."""
    if finding.rule not in RULES:
        raise ValueError(f"finding rule {finding.rule!r} is not in the alert catalog")
    bad = [k for k, v in finding.entity.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad or not finding.entity:
        raise ValueError(
            f"finding {finding.rule}: entity must be a non-empty dict of strings, got {finding.entity!r}"
        )
    if (
        isinstance(finding.affected_gpus, bool)
        or not isinstance(finding.affected_gpus, int)
        or finding.affected_gpus < 0
    ):
        raise ValueError(
            f"finding {finding.rule}: affected_gpus must be a non-negative integer, "
            f"got {finding.affected_gpus!r}"
        )


class AlertEngine:
    """Alert state: what fires, what resolved, and the incidents they form."""

    def __init__(
        self,
        price_per_gpu_hour: float = 2.5,
        resolve_after: float = 5.0,
        incident_window: float = 600.0,
        *,
        pending_for: Mapping[str, float] | None = None,
        places: Places | None = None,
        state: AlertState | None = None,
    ) -> None:
        if not math.isfinite(price_per_gpu_hour) or price_per_gpu_hour < 0:
            raise ValueError(f"price_per_gpu_hour must be a non-negative number, got {price_per_gpu_hour!r}")
        if not math.isfinite(resolve_after) or resolve_after < 0:
            raise ValueError(f"resolve_after must be a non-negative number of seconds, got {resolve_after!r}")
        self.pending_for = check_pending(pending_for or {})
        self.price_per_gpu_hour = price_per_gpu_hour
        self.resolve_after = resolve_after
        self.places = places
        self._pending: dict[FindingKey, tuple[float, Finding]] = {}
        self.pending_cleared = 0  # findings that vanished before their pending time was up
        self._active: dict[FindingKey, Alert] = {}
        self.state: AlertState = state if state is not None else LocalAlertState(None, incident_window)
        #: fired alerts that another hub already fired: continued instead of notified again
        self.continued = 0
        #: how long an alert continued from another hub waits for this hub's detectors to see it
        self.continue_grace = 0.0

    def update(self, now: float, findings: list[Finding]) -> list[AlertChange]:
        """Apply the findings of the evaluation at ``now``; returns what fired and what resolved.
        Every transition is recorded (on a single hub: saved, in one store write) before it
        returns, so an alert is kept before anyone is told of it."""
        with self.state.batch():
            return self._update(now, findings)

    def _update(self, now: float, findings: list[Finding]) -> list[AlertChange]:
        if not math.isfinite(now):
            raise ValueError(f"evaluation time must be finite, got {now!r}")
        changes: list[AlertChange] = []
        current: set[FindingKey] = set()
        for finding in findings:
            _check(finding)
            key = finding.key
            current.add(key)
            alert = self._active.get(key)
            if alert is None:
                hold = self.pending_for.get(finding.rule, 0.0)
                if hold > 0:
                    since = self._pending.get(key, (now, finding))[0]
                    if now - since < hold:
                        self._pending[key] = (since, finding)
                        continue
                    self._pending.pop(key, None)
                    finding.details = {**finding.details, "pending_since": since}
                alert = self._fire(now, finding)
                theirs = self.state.fired(alert, self.places_of(alert), now)
                if theirs is not None:
                    self.continued += 1
                    self.adopt([theirs], now, self.continue_grace)
                    continue
                self._active[key] = alert
                changes.append(AlertChange("fired", alert))
            else:
                was, stage = alert.severity, _stage(alert)
                self._refresh(alert, now, finding)
                if alert.severity != was or finding.stage > stage:
                    self._escalate(alert, now, was, max(stage, finding.stage))
                    changes.append(AlertChange("escalated", alert))
        for key in [k for k in self._pending if k not in current]:
            del self._pending[key]  # pending requires the condition to hold throughout
            self.pending_cleared += 1
        for key, alert in list(self._active.items()):
            if key not in current and now - alert.last_seen >= self.resolve_after:
                alert.resolved_at = now
                del self._active[key]
                if self.state.resolved(alert, now):
                    changes.append(AlertChange("resolved", alert))
        return changes

    def _fire(self, now: float, finding: Finding) -> Alert:
        spec = RULES[finding.rule]
        alert = Alert(
            id=self.next_id(),
            rule=finding.rule,
            severity=spec.tier,
            owner=spec.owner,
            entity=dict(finding.entity),
            started_at=now,
            summary=finding.summary,
            cost_per_hour=self.cost_per_hour(finding),
            last_seen=now,
        )
        self._refresh(alert, now, finding)
        if finding.stage:
            alert.details[FIRED_STAGE] = finding.stage
        return alert

    def _escalate(self, alert: Alert, now: float, was: str, stage: int) -> None:
        """Record that a firing alert grew graver (a tier, or a stage of worsening) at ``now``."""
        if alert.severity != was:
            alert.details[ESCALATED_FROM] = was
        entry = {"at": now, "from": was, "severity": alert.severity, "value": alert.value}
        entry.update(summary=alert.summary, stage=stage)
        alert.details[WORSENED] = [*alert.details.get(WORSENED, []), entry]
        self.state.save(alert)  # the graver reading is what every page shows from now on

    def places_of(self, alert: Alert) -> list[Labels] | None:
        """Where a job or service alert runs, linking it to hardware alerts there (None: it names
        its node, or lists its own links)."""
        if self.places is None or alert.details.get("links") or "node" in alert.entity:
            return None
        return self.places(alert.entity)

    def next_id(self) -> str:
        """The id of the next alert (sharded hubs draw ids from a cluster-wide sequence)."""
        return self.state.next_id()

    def adopt(self, alerts: list[Alert], now: float, grace: float) -> int:
        """Continue alerts fired earlier (by this hub before a restart, or by another hub): they
        are not fired again, and resolve only if their condition stays absent for ``grace`` +
        ``resolve_after`` seconds (time for the detectors to see the data)."""
        taken: list[Alert] = []
        for alert in alerts:
            key = (alert.rule, tuple(sorted(alert.entity.items())))
            if key in self._active:
                continue
            alert.last_seen = max(alert.last_seen, now + grace)
            self._active[key] = alert
            taken.append(alert)
        self.state.continued(taken)
        return len(taken)

    def drop(self, gone: Callable[[Labels], bool]) -> int:
        """Forget (without resolving) the alerts and pending conditions of entities this hub no
        longer decides (a cluster member's released shards); their new owner continues them."""
        keys = [k for k, a in self._active.items() if gone(a.entity)]
        for key in keys:
            del self._active[key]
        for key in [k for k in self._pending if gone(dict(k[1]))]:
            del self._pending[key]
        return len(keys)

    def _refresh(self, alert: Alert, now: float, finding: Finding) -> None:
        alert.last_seen = now
        alert.severity = graver(alert.severity, finding.severity)
        alert.summary = finding.summary
        alert.value = finding.value if finding.value is not None and math.isfinite(finding.value) else None
        kept = {
            k: alert.details[k]
            for k in (*KEPT_DETAILS, ESCALATED_FROM, WORSENED, FIRED_STAGE)
            if k in alert.details
        }
        alert.details = {**finding.details, **kept}
        alert.cost_per_hour = self.cost_per_hour(finding)

    def cost_per_hour(self, finding: Finding) -> float:
        """What an hour of delay costs: the GPUs affected, at their price, times the share at risk."""
        share = RULES[finding.rule].work_at_risk if finding.at_risk is None else finding.at_risk
        return finding.affected_gpus * self.price_per_gpu_hour * share

    def all(self) -> list[Alert]:
        """Every alert raised so far, firing or resolved, in the order they fired."""
        return self.state.view()[0]

    def firing(self) -> list[Alert]:
        return list(self._active.values())

    def pending(self) -> list[dict[str, Any]]:
        """Conditions that hold but have not yet held for their rule's pending time."""
        return [
            {"rule": f.rule, "entity": dict(f.entity), "since": since, "summary": f.summary}
            for since, f in self._pending.values()
        ]

    def get(self, alert_id: str) -> Alert | None:
        return next((a for a in reversed(self.all()) if a.id == alert_id), None)

    def incidents(self) -> list[Incident]:
        return self.state.view()[1]


def _stage(alert: Alert) -> int:
    """The stage of worsening an alert was last told at (that of the finding it fired on, at first)."""
    told = alert.details.get(WORSENED)
    return int(told[-1]["stage"]) if told else int(alert.details.get(FIRED_STAGE, 0))


def check_pending(pending_for: Mapping[str, float], where: str = "pending_for") -> dict[str, float]:
    """Validate per-rule pending times; hard-fault rules must fire at once. Errors name the
    field as ``where.rule`` (``alerting.pending.loss_plateau`` for the config file's)."""
    out: dict[str, float] = {}
    for rule, seconds in pending_for.items():
        if rule not in RULES:
            raise ValueError(f"{where}.{rule}: not a rule of the alert catalog")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
            raise ValueError(f"{where}.{rule}: must be a non-negative number of seconds")
        if seconds > 0 and RULES[rule].hard:
            raise ValueError(f"{where}.{rule}: a hard fault fires at once (time to detect)")
        out[rule] = float(seconds)
    return out


def graver(tier: str, other: str | None) -> str:
    """The graver of two tiers (P1 is gravest); ``None`` leaves ``tier`` as it is."""
    if other is None or other not in TIERS:
        return tier
    return min(tier, other, key=TIERS.index)
