"""What the dispatcher sent, and when: read back when a hub continues alerts another hub notified.

A single hub's :class:`~gpuscope.alert.dispatch.Dispatcher` keeps its groups in memory, and that
memory is its whole ledger (:class:`MemoryLedger` has nothing to read back). The members of a
cluster write each send into PostgreSQL in the transaction that queues it
(:class:`gpuscope.cluster.outbox.PgOutbox`), so a member taking over a shard continues its alerts'
groups where their last owner left them: nobody is told twice, and nobody is left untold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuscope.rules import TIERS


@dataclass(frozen=True, slots=True)
class Told:
    """What receivers were told of one alert."""

    #: receiver -> the last time it was told the alert fires
    firing: dict[str, float] = field(default_factory=dict)
    #: escalation levels (0-based) already sent
    escalated: frozenset[int] = frozenset()
    #: receiver -> the last time it was told the alert resolved
    resolved: dict[str, float] = field(default_factory=dict)
    #: receiver -> the gravest tier it was told the alert fires at (absent: not known)
    severity: dict[str, str] = field(default_factory=dict)

    def resolution_owed(self) -> list[str]:
        """Receivers told the alert fires and not told since that it resolved."""
        return [r for r, at in self.firing.items() if self.resolved.get(r, float("-inf")) < at]

    def escalation_owed(self, receiver: str, severity: str) -> bool:
        """Whether ``receiver`` was told the alert fires at a lesser tier than ``severity`` (it
        reached the graver tier after that, and its last owner had not told it yet)."""
        told = self.severity.get(receiver)
        if told not in TIERS or severity not in TIERS:
            return False
        return TIERS.index(severity) < TIERS.index(told)


class DispatchLedger(Protocol):
    def told(self, alert_id: str) -> Told: ...

    def told_many(self, alert_ids: list[str]) -> dict[str, Told]:
        """:meth:`told` of each alert (those never told may be left out)."""
        ...


class MemoryLedger:
    """One hub: its dispatcher's memory is the ledger; it continues no other hub's alerts."""

    def told(self, alert_id: str) -> Told:
        return Told()

    def told_many(self, alert_ids: list[str]) -> dict[str, Told]:
        return {}
