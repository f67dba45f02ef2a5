"""Escalation: a P1 nobody acknowledged within ``after`` goes to the next receiver, then the next.

Levels are ordered by delay; each level is sent once per alert, and an alert escalated to a
receiver is resolved there too when it clears. Acknowledging stops further levels; a silenced or
maintenance-muted alert does not escalate (someone already decided about it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import Matcher, matches_all, parse_matchers
from gpuscope.keys import check_keys
from gpuscope.model import Labels


@dataclass(frozen=True, slots=True)
class EscalationLevel:
    after: float
    receiver: str
    matchers: list[Matcher] = field(default_factory=list)

    def applies(self, labels: Labels, firing_for: float) -> bool:
        return firing_for >= self.after and matches_all(self.matchers, labels)


def parse_escalation(raw: Any, receivers: set[str]) -> list[EscalationLevel]:
    """``[{after: 15m, receiver: NAME, matchers: {severity: P1}}, ...]`` (default matcher: P1)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("alerting.escalation: must be a list of levels")
    levels: list[EscalationLevel] = []
    for i, item in enumerate(raw):
        where = f"alerting.escalation[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be a mapping")
        check_keys(item, where, {"after", "receiver", "matchers", "match"})
        receiver = item.get("receiver")
        if receiver not in receivers:
            raise ValueError(f"{where}.receiver: {receiver!r} is not a defined receiver")
        matchers = parse_matchers(item.get("matchers", item.get("match", {"severity": "P1"})), where)
        after = parse_duration(item.get("after"), f"{where}.after")
        levels.append(EscalationLevel(after, str(receiver), matchers))
    return sorted(levels, key=lambda level: level.after)
