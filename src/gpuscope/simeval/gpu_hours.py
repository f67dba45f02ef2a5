"""GPU-hours per state, measured by the hub against the simulator's ground truth."""

from __future__ import annotations

from typing import Any

from gpuscope.productivity.states import STATES


def compare(measured: dict[str, float], true: dict[str, float]) -> dict[str, Any]:
    """Per state: true and measured GPU-hours and the error as a percentage of all GPU-hours."""
    total = sum(true.values())
    states: dict[str, dict[str, float]] = {}
    for state in STATES:
        t, m = true.get(state, 0.0), measured.get(state, 0.0)
        error = 100.0 * abs(m - t) / total if total > 0 else 0.0
        states[state] = {"true": round(t, 4), "measured": round(m, 4), "error_pct": round(error, 3)}
    return {
        "total_gpu_hours": round(total, 4),
        "states": states,
        "max_error_pct": max((s["error_pct"] for s in states.values()), default=0.0),
    }
