"""Flap suppression: a condition that fires again and again is one problem, not a page each time.

The alert engine already bridges short gaps (``resolve_after``); this catches the slower flap. When
the same rule on the same entity has fired ``threshold`` times within ``window`` seconds it is
flapping: its notifications are held (counted) until it has not fired again for ``window`` seconds,
after which its current state is notified once.
"""

from __future__ import annotations

from collections import deque

from gpuscope.model import Alert

Key = tuple[str, tuple[tuple[str, str], ...]]


def alert_key(alert: Alert) -> Key:
    return (alert.rule, tuple(sorted(alert.entity.items())))


class FlapDetector:
    def __init__(self, threshold: int = 4, window: float = 900.0) -> None:
        if threshold < 2 or window <= 0:
            raise ValueError(f"flap detection needs threshold >= 2 and window > 0, got {threshold}, {window}")
        self.threshold = threshold
        self.window = window
        self._fires: dict[Key, deque[float]] = {}

    def fired(self, alert: Alert) -> None:
        """Record that an alert (re)fired at its start time."""
        times = self._fires.setdefault(alert_key(alert), deque())
        times.append(alert.started_at)
        while times and times[0] < alert.started_at - self.window:
            times.popleft()

    def flapping(self, alert: Alert, now: float) -> bool:
        times = self._fires.get(alert_key(alert))
        if not times:
            return False
        recent = sum(1 for t in times if t >= now - self.window)
        return recent >= self.threshold

    def forget_old(self, now: float) -> None:
        """Drop keys with no fire inside the window (bounded memory)."""
        for key in [k for k, t in self._fires.items() if not t or t[-1] < now - self.window]:
            del self._fires[key]
