"""Recurring maintenance windows: planned work that must not page anyone.

A window recurs on given weekdays (every day by default) from a local start time for a duration, in
a time zone (``UTC`` by default), or is one-off between two instants. Matching alerts fire and are
recorded as usual but notify nobody while the window is open; one still firing when it closes is
notified then, so a fault that outlives the maintenance is not lost.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import Matcher, matches_all, parse_matchers
from gpuscope.keys import check_keys
from gpuscope.model import Labels

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(slots=True)
class MaintenanceWindow:
    name: str
    matchers: list[Matcher]
    duration: float
    start: dt.time | None = None  # recurring: local start time
    weekdays: frozenset[int] = field(default_factory=lambda: frozenset(range(7)))
    tz: dt.tzinfo = dt.UTC
    starts_at: float | None = None  # one-off: absolute instants
    ends_at: float | None = None

    def open_at(self, now: float) -> bool:
        """Is the window open at the Unix time ``now``?"""
        if self.starts_at is not None and self.ends_at is not None:
            return self.starts_at <= now < self.ends_at
        assert self.start is not None
        local = dt.datetime.fromtimestamp(now, self.tz)
        # A window may run past midnight: look at starts on the days it could have begun.
        days_back = int(self.duration // 86400) + 1
        for back in range(days_back + 1):
            day = local.date() - dt.timedelta(days=back)
            if day.weekday() not in self.weekdays:
                continue
            begin = dt.datetime.combine(day, self.start, self.tz).timestamp()
            if begin <= now < begin + self.duration:
                return True
        return False

    def mutes(self, labels: Labels, now: float) -> bool:
        return matches_all(self.matchers, labels) and self.open_at(now)


def _weekdays(raw: Any, where: str) -> frozenset[int]:
    if raw is None:
        return frozenset(range(7))
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}.weekdays: must be a non-empty list such as [sat, sun]")
    out: set[int] = set()
    for day in raw:
        name = str(day).lower()[:3]
        if name not in WEEKDAYS:
            raise ValueError(f"{where}.weekdays: {day!r} is not a weekday")
        out.add(WEEKDAYS.index(name))
    return frozenset(out)


WINDOW_KEYS = frozenset(
    {"name", "matchers", "match", "weekdays", "start", "duration", "timezone", "starts_at", "ends_at"}
)


def parse_window(raw: Any, where: str) -> MaintenanceWindow:
    """``{name, matchers, weekdays?, start: "02:00", duration: 2h, timezone?}`` or
    ``{name, matchers, starts_at: UNIX, ends_at: UNIX}``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping")
    check_keys(raw, where, WINDOW_KEYS)
    name = str(raw.get("name", where))
    matchers = parse_matchers(raw.get("matchers", raw.get("match")), f"{where}.matchers")
    if "starts_at" in raw or "ends_at" in raw:
        try:
            starts, ends = float(raw["starts_at"]), float(raw["ends_at"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: a one-off window needs numeric starts_at and ends_at") from None
        if ends <= starts:
            raise ValueError(f"{where}: ends_at must be after starts_at")
        return MaintenanceWindow(name, matchers, ends - starts, starts_at=starts, ends_at=ends)
    try:
        start = dt.time.fromisoformat(str(raw["start"]))
    except KeyError:
        raise ValueError(f'{where}.start: a recurring window needs a start time such as "02:00"') from None
    except ValueError:
        raise ValueError(f'{where}.start: {raw["start"]!r} is not a time of day such as "02:00"') from None
    duration = parse_duration(raw.get("duration"), f"{where}.duration")
    if not 0 < duration <= 7 * 86400:
        raise ValueError(f"{where}.duration: must be more than 0 and at most a week")
    tz_name = str(raw.get("timezone", "UTC"))
    try:
        tz: dt.tzinfo = dt.UTC if tz_name == "UTC" else ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{where}.timezone: {tz_name!r} is not a known time zone") from None
    return MaintenanceWindow(
        name, matchers, duration, start=start, weekdays=_weekdays(raw.get("weekdays"), where), tz=tz
    )


def parse_windows(raw: Any) -> list[MaintenanceWindow]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("alerting.maintenance: must be a list of windows")
    return [parse_window(w, f"alerting.maintenance[{i}]") for i, w in enumerate(raw)]
