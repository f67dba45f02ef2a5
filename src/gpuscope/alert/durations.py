"""Durations as users write them in Alertmanager configs: ``30s``, ``5m``, ``4h``, ``1d``, or seconds."""

from __future__ import annotations

import math
import re
from typing import Any

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: Any, where: str) -> float:
    """Seconds from ``1h30m``-style text or a plain non-negative number."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: {value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _PART_RE.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{where}: {value!r} is not a duration such as 30s, 5m, 4h or 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"{where}: {value!r} is not a duration such as 30s, 5m, 4h or 1h30m")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{where}: must be a non-negative duration, got {value!r}")
    return seconds
