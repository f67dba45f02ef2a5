"""Silence the cluster caused is not the senders': holds on silence verdicts after a takeover.

When a hub takes shards over (a member died, left or joined), the senders of those shards are
moving: they notice the old owner is gone at their next send, fail over to another hub, and its
answer names the new owner. For that bounded time their silence is the cluster's gap, not
theirs (the same principle as a hub that is behind on its own ingest). So the new owner holds the
silence verdicts (``node_unreachable``, ``rank_lost``, ``training_stalled``) on the entities of
those shards until the grace has passed, then judges normally: the detectors keep reporting a
sender that is still silent, so a node that really died is alerted at the end of the hold at the
latest. A verdict on an alert that is already firing (continued from the old owner) is never held,
so a hold cannot resolve it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuscope.counters import Counters
from gpuscope.model import Alert, Finding, Labels
from gpuscope.rules import NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED

#: the rules that judge a sender by its silence
SILENCE_RULES = frozenset({NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED})

Held = Callable[[Labels], bool]


class SilenceHolds:
    """Holds on silence verdicts, each over the entities ``held`` selects, until a hub time.
    Counter: ``silence_verdicts_held`` (findings withheld while a hold lasted)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._holds: list[tuple[Held, float]] = []

    def hold(self, held: Held, until: float) -> None:
        self._holds.append((held, until))

    def until(self, entity: Labels, now: float) -> float | None:
        """When the hold on ``entity``'s silence verdicts ends (None: not held at ``now``)."""
        ends = [until for held, until in self._holds if until > now and held(entity)]
        return max(ends) if ends else None

    def apply(
        self, findings: list[Finding], now: float, firing: Callable[[], Iterable[Alert]]
    ) -> list[Finding]:
        """``findings`` less the silence verdicts held at ``now`` on alerts not already firing."""
        self._holds = [(held, until) for held, until in self._holds if until > now]
        if not self._holds:
            return findings
        fired = {(a.rule, tuple(sorted(a.entity.items()))) for a in firing() if a.rule in SILENCE_RULES}
        out = []
        for finding in findings:
            if (
                finding.rule in SILENCE_RULES
                and (finding.rule, tuple(sorted(finding.entity.items()))) not in fired
                and any(held(finding.entity) for held, _ in self._holds)
            ):
                self.counters.inc("silence_verdicts_held")
                continue
            out.append(finding)
        return out
