"""Helpers the dashboard views share: severity order, natural sorting, alert placement."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from gpuscope.model import Alert
from gpuscope.rules import GPU_UNDERPERFORMING

SEVERITY_RANK = {"P1": 3, "P2": 2, "P3": 1}
_DIGITS = re.compile(r"(\d+)")


@lru_cache(maxsize=65_536)
def natural_key(text: str) -> tuple[Any, ...]:
    """``node-2`` before ``node-10``: operators read numbers, not code points."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(text))


def worst(severities: Iterable[str]) -> str | None:
    """The most urgent tier among ``severities`` (P1 first), or None when there is none."""
    best: str | None = None
    for sev in severities:
        if best is None or SEVERITY_RANK.get(sev, 0) > SEVERITY_RANK.get(best, 0):
            best = sev
    return best


def finite(value: Any) -> float | None:
    """A float fit for JSON: NaN and infinities travel as null."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def alert_brief(alert: Alert) -> dict[str, Any]:
    """What a page needs to list an alert and link to it."""
    return {
        "id": alert.id,
        "rule": alert.rule,
        "severity": alert.severity,
        "entity": dict(alert.entity),
        "summary": alert.summary,
        "started_at": alert.started_at,
        "resolved_at": alert.resolved_at,
        "cost_per_hour": finite(alert.cost_per_hour),
        "incident": alert.incident,
    }


def faulty_part(alert: Alert) -> dict[str, Any] | None:
    """A firing ``gpu_underperforming`` of a GPU that has lagged its speed group past what parts of
    one model differ by since it started (``details.since_start``): which GPU, in which job, its lag
    and what it costs the job, the alert's own figures (its value is the pace, 1 - lag). None for
    any other alert: a GPU that slowed down later is a live slowdown, not a faulty part."""
    if alert.rule != GPU_UNDERPERFORMING or alert.details.get("since_start") is not True:
        return None
    if alert.resolved_at is not None:
        return None
    return {
        "id": alert.id,
        "severity": alert.severity,
        "node": alert.entity.get("node"),
        "gpu": alert.entity.get("gpu"),
        "job": alert.details.get("job"),
        "lag_share": finite(alert.details.get("lag_share")),
        "lost_share": finite(alert.details.get("lost_share")),
        "cost_per_hour": finite(alert.cost_per_hour),
        "summary": alert.summary,
    }


class AlertIndex:
    """Firing alerts indexed by the node, GPU, job and service they name."""

    def __init__(self, alerts: Iterable[Alert]) -> None:
        self.by_gpu: dict[tuple[str, str], list[Alert]] = {}
        self.by_node: dict[str, list[Alert]] = {}
        self.by_job: dict[str, list[Alert]] = {}
        self.by_service: dict[str, list[Alert]] = {}
        for alert in alerts:
            e = alert.entity
            if "node" in e:
                self.by_node.setdefault(e["node"], []).append(alert)
                if "gpu" in e:
                    self.by_gpu.setdefault((e["node"], e["gpu"]), []).append(alert)
            # a GPU's alert of the job it runs (gpu_underperforming) is the job's too: its page and
            # status list it (a job with a faulty GPU was "running", its P2 on no job page)
            job = e.get("job") or alert.details.get("job")
            if isinstance(job, str) and job:
                self.by_job.setdefault(job, []).append(alert)
            if "service" in e:
                self.by_service.setdefault(e["service"], []).append(alert)

    def gpu_severity(self, node: str, gpu: str) -> str | None:
        return worst(a.severity for a in self.by_gpu.get((node, gpu), []))

    def node_severity(self, node: str) -> str | None:
        return worst(a.severity for a in self.by_node.get(node, []))
