"""Ranking by cost of delay: tier first (P1 loses work), then what an hour of waiting costs."""

from __future__ import annotations

from typing import Any

from gpuscope.alert.incidents import Incident, job_of, since_start
from gpuscope.model import Alert


def rank_alerts(alerts: list[Alert]) -> list[Alert]:
    """Firing before resolved, then P1 < P2 < P3, then the costliest hour first."""
    return sorted(alerts, key=lambda a: (not a.firing, a.severity, -a.cost_per_hour, a.started_at))


def cost_per_hour(firing: list[Alert]) -> float:
    """What an hour of the firing alerts costs: summed, but what has slowed a job since it started
    (its placements, a GPU faulty from its start: :func:`since_start`) once, the largest. A
    synchronous job runs at its slowest pace: a slow GPU and its ranks' slow group, two alerts of
    one job's pace, lose that pace once."""
    placed: dict[str, float] = {}
    total = 0.0
    for alert in firing:
        job = job_of(alert)
        if job is not None and since_start(alert):
            placed[job] = max(placed.get(job, 0.0), alert.cost_per_hour)
        else:
            total += alert.cost_per_hour
    return total + sum(placed.values())


def incident_summary(incident: Incident, alerts: dict[str, Alert]) -> dict[str, Any]:
    """An incident with its tier (gravest firing member) and cost per hour (firing members summed,
    a job's slowdowns since its start once: :func:`cost_per_hour`)."""
    members = [alerts[i] for i in incident.members if i in alerts]
    firing = [a for a in members if a.firing]
    pool = firing or members
    tier = min((a.severity for a in pool), default="P3")
    root = alerts.get(incident.root)
    return {
        **incident.to_dict(),
        "tier": tier,
        "cost_per_hour": cost_per_hour(firing),
        "firing": len(firing),
        "root_rule": root.rule if root else None,
        "root_entity": dict(root.entity) if root else {},
        "diagnosis": (root.details.get("playbook") or {}).get("summary", "") if root else "",
    }


def rank_incidents(incidents: list[Incident], alerts: list[Alert]) -> list[dict[str, Any]]:
    by_id = {a.id: a for a in alerts}
    rows = [incident_summary(i, by_id) for i in incidents]
    return sorted(
        rows, key=lambda r: (r["resolved_at"] is not None, r["tier"], -r["cost_per_hour"], r["started_at"])
    )
