"""Error budgets: per-service SLOs and their burn rates over the Google SRE multi-window pairs.

An SLO says what share of requests must be good: ``availability`` (not failed) or ``latency``
(not failed and faster than ``threshold_seconds``). The burn rate of a window is its bad share
divided by the budget ``1 - objective``: 1 spends the budget exactly over the SLO period. A pair
alerts when both its long and short windows burn faster than its factor (1 h/5 m at 14.4×,
6 h/30 m at 6×, 3 d/6 h at 1×; the short window makes the alert stop soon after the burn does).
Counts are kept in ``bucket`` second slots for the longest window, so memory is bounded.

Config (the hub's YAML, key ``slos``)::

    slos:
      - {service: chat-api, availability: 0.999, latency: {threshold_seconds: 0.5, objective: 0.99}}
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpuscope.keys import check_keys

#: (name, long window s, short window s, burn factor)
PAIRS: tuple[tuple[str, float, float, float], ...] = (
    ("page_fast", 3600.0, 300.0, 14.4),
    ("page_slow", 6 * 3600.0, 1800.0, 6.0),
    ("ticket", 3 * 86400.0, 6 * 3600.0, 1.0),
)
WINDOW_NAMES = {300.0: "5m", 1800.0: "30m", 3600.0: "1h", 6 * 3600.0: "6h", 3 * 86400.0: "3d"}


@dataclass(frozen=True, slots=True)
class Slo:
    service: str
    kind: str  # "availability" or "latency"
    objective: float
    threshold_seconds: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.objective < 1.0:
            raise ValueError(f"SLO objective of {self.service} must be within (0, 1), got {self.objective}")
        if self.kind == "latency" and not (self.threshold_seconds and self.threshold_seconds > 0):
            raise ValueError(f"latency SLO of {self.service} needs a positive threshold_seconds")
        if self.kind not in ("availability", "latency"):
            raise ValueError(f"SLO kind must be availability or latency, got {self.kind!r}")


SLO_KEYS = frozenset({"service", "availability", "latency"})
LATENCY_KEYS = frozenset({"objective", "threshold_seconds"})


def _share(value: Any, where: str) -> float:
    """An objective: a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise ValueError(f"{where}: must be a number within (0, 1) such as 0.999, got {value!r}")
    return float(value)


def slos_from_config(raw: Any) -> list[Slo]:
    """Parse the ``slos`` list of the config; errors name the entry and its key."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("slos: must be a list")
    out = []
    for i, entry in enumerate(raw):
        where = f"slos[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be a mapping such as {{service: chat, availability: 0.999}}")
        if not isinstance(entry.get("service"), str) or not entry["service"]:
            raise ValueError(f"{where}.service: needs the service's name")
        check_keys(entry, where, SLO_KEYS)
        if "availability" not in entry and "latency" not in entry:
            raise ValueError(f"{where}: needs availability, latency or both")
        service = entry["service"]
        if "availability" in entry:
            out.append(Slo(service, "availability", _share(entry["availability"], f"{where}.availability")))
        if "latency" in entry:
            lat, at = entry["latency"], f"{where}.latency"
            if not isinstance(lat, dict):
                raise ValueError(f"{at}: must be a mapping {{threshold_seconds: S, objective: 0.99}}")
            check_keys(lat, at, LATENCY_KEYS)
            missing = sorted(LATENCY_KEYS - lat.keys())
            if missing:
                raise ValueError(f"{at}.{missing[0]}: is required")
            threshold = lat["threshold_seconds"]
            if (
                isinstance(threshold, bool)
                or not isinstance(threshold, int | float)
                or not 0 < threshold < math.inf
            ):
                raise ValueError(
                    f"{at}.threshold_seconds: must be a positive number of seconds, got {threshold!r}"
                )
            out.append(Slo(service, "latency", _share(lat["objective"], f"{at}.objective"), float(threshold)))
    return out


class BurnRates:
    """Good/bad counts of one SLO in time slots; burn rates of every window on demand."""

    def __init__(self, slo: Slo, bucket: float = 30.0) -> None:
        self.slo = slo
        self.bucket = bucket
        self.horizon = max(long for _, long, _, _ in PAIRS)
        self._slots: deque[tuple[int, float, float]] = deque()  # (slot, total, bad)

    def add(self, ts: float, total: float, bad: float) -> None:
        if total < 0 or bad < 0 or bad > total or not (math.isfinite(total) and math.isfinite(bad)):
            raise ValueError(f"counts must satisfy 0 <= bad <= total, got bad={bad} total={total}")
        slot = int(ts // self.bucket)
        if self._slots and self._slots[-1][0] == slot:
            _, t, b = self._slots.pop()
            self._slots.append((slot, t + total, b + bad))
        elif self._slots and self._slots[-1][0] > slot:  # late window: fold into its slot
            items = list(self._slots)
            for i, (s, t, b) in enumerate(items):
                if s >= slot:
                    items[i] = (s, t + total, b + bad)
                    break
            self._slots = deque(items)
        else:
            self._slots.append((slot, total, bad))
        oldest = slot - int(self.horizon // self.bucket) - 1
        while self._slots and self._slots[0][0] < oldest:
            self._slots.popleft()

    def burn_rate(self, now: float, window: float) -> float:
        """Bad share over the last ``window`` seconds / error budget; NaN with no traffic."""
        first = int((now - window) // self.bucket) + 1
        total = bad = 0.0
        for slot, t, b in self._slots:
            if slot >= first:
                total += t
                bad += b
        if total <= 0:
            return math.nan
        return (bad / total) / (1.0 - self.slo.objective)

    def evaluate(self, now: float) -> dict[str, Any]:
        """Burn rate per window and, per pair, whether both of its windows exceed the factor."""
        windows = {WINDOW_NAMES[w]: self.burn_rate(now, w) for w in sorted(WINDOW_NAMES)}
        alerts = {
            name: bool(windows[WINDOW_NAMES[long]] >= factor and windows[WINDOW_NAMES[short]] >= factor)
            for name, long, short, factor in PAIRS
        }
        return {"windows": windows, "alerts": alerts}
