"""The reports page's data: idle GPU-hours and their cost, failing-GPU candidates, utilization trends.

Every figure covers the dashboard's range (``range`` seconds, up to 366 days; ``days`` is the
older spelling); the trend's step follows it (days, hours or five minutes).

Everything is read through the store seam (fleet-wide series, per-group aggregates) and the
alert history, so it works the same on a remote TSDB backend. Idle-allocated hours come from
``gpu_idle_allocated`` alerts (the GPUs a job held while doing nothing); unused capacity is the
complement of the mean utilization over the GPUs that reported. The scheduler's history per
partition (queue wait, GPUs asked for vs GPUs there) reads the Slurm collector's series.
"""

from __future__ import annotations

from typing import Any

from gpuscope.hub import Hub
from gpuscope.rules import rules_of
from gpuscope.web.dashboard.common import SEVERITY_RANK, finite, natural_key

UTIL = "gpu_utilization_percent"
OBSERVED_BUCKET_SECONDS = 300.0
HARDWARE_RULES = rules_of("hardware")
#: the Slurm collector's per-partition series (signals.SCHEDULER_METRICS) -> history column
PARTITION_SERIES = {
    "slurm_gpus_pending": "gpus_pending",
    "slurm_gpus_running": "gpus_running",
    "slurm_gpus_total": "gpus_total",
    "slurm_gpus_unavailable": "gpus_unavailable",
    "slurm_oldest_pending_seconds": "oldest_pending_seconds",
}
#: per running job (labelled partition): how long it waited in the queue
QUEUE_WAIT = "slurm_job_queue_wait_seconds"


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def trend_bucket(seconds: float) -> float:
    """The trend's step for a report over ``seconds``: days over two days or more, hours over six
    hours or more, else five minutes (a 15-minute report still draws a line)."""
    if seconds >= 2 * 86400.0:
        return 86400.0
    return 3600.0 if seconds >= 6 * 3600.0 else OBSERVED_BUCKET_SECONDS


def reports_view(hub: Hub, now: float, seconds: float) -> dict[str, Any]:
    """Capacity-planning figures over the last ``seconds`` (the dashboard's range)."""
    start = now - seconds
    bucket = trend_bucket(seconds)
    price = hub.alerts.price_per_gpu_hour
    history = hub.stored_alerts(False, 100_000)
    idle_hours = 0.0
    idle_cost = 0.0
    idle_jobs: dict[str, float] = {}
    for alert in history:
        if alert.rule != "gpu_idle_allocated":
            continue
        hours = _overlap(alert.started_at, alert.resolved_at or now, start, now) / 3600.0
        gpus = alert.cost_per_hour / price if price > 0 else 0.0
        idle_hours += hours * gpus
        idle_cost += hours * alert.cost_per_hour
        job = alert.entity.get("job", "?")
        idle_jobs[job] = idle_jobs.get(job, 0.0) + hours * gpus
    per_gpu = hub.store.aggregate(UTIL, "uuid", start, now)
    trend = hub.store.series(UTIL, {}, start, now, max(1, round(seconds / bucket)))
    per_node = sorted(hub.store.aggregate(UTIL, "node", start, now), key=lambda g: natural_key(g["group"]))
    # observed span: five-minute buckets that hold any sample (data may cover a fraction of the window)
    fine = hub.store.series(UTIL, {}, start, now, max(1, round(seconds / OBSERVED_BUCKET_SECONDS)))
    span_hours = sum(1 for p in fine if finite(p.value) is not None) * OBSERVED_BUCKET_SECONDS / 3600.0
    mean_util = (
        sum(g["mean"] * g["count"] for g in per_gpu) / sum(g["count"] for g in per_gpu) if per_gpu else None
    )
    unused_hours = None if mean_util is None else len(per_gpu) * span_hours * (1 - mean_util / 100.0)
    return {
        "range_seconds": seconds,
        "days": round(seconds / 86400.0, 4),
        "trend_bucket_seconds": bucket,
        "start": start,
        "end": now,
        "price_per_gpu_hour": price,
        "idle_allocated": {
            "gpu_hours": round(idle_hours, 3),
            "cost": round(idle_cost, 2),
            "by_job": {k: round(v, 3) for k, v in sorted(idle_jobs.items(), key=lambda kv: -kv[1])},
        },
        "unused_capacity": {
            "gpus": len(per_gpu),
            "mean_utilization_percent": finite(mean_util),
            "observed_hours": round(span_hours, 3),
            "gpu_hours": None if unused_hours is None else round(unused_hours, 3),
            "cost": None if unused_hours is None else round(unused_hours * price, 2),
        },
        "failing_candidates": failing_candidates(history, start),
        "waste": waste_ranking(hub, start, now),
        "trend": [[p.ts, finite(p.value)] for p in trend],
        "by_node": [
            {"node": g["group"], "mean": finite(g["mean"]), "max": finite(g["max"])} for g in per_node
        ],
        "scheduler": scheduler_history(hub, start, now, max(2, round(seconds / 3600.0))),
    }


def scheduler_history(hub: Hub, start: float, end: float, points: int) -> list[dict[str, Any]]:
    """Per partition: queue wait and demand (GPUs pending + running) vs capacity (GPUs total less
    unavailable), as a summary over the window and as a history of ``points`` buckets."""
    waits = {g["group"]: g for g in hub.store.aggregate(QUEUE_WAIT, "partition", start, end)}
    partitions = sorted(
        {g["group"] for g in hub.store.aggregate("slurm_gpus_total", "partition", start, end)} | set(waits),
        key=natural_key,
    )
    out = []
    for part in partitions:
        cols: dict[str, dict[float, float | None]] = {
            name: {
                p.ts: finite(p.value)
                for p in hub.store.series(metric, {"partition": part}, start, end, points)
            }
            for metric, name in PARTITION_SERIES.items()
        }
        cols["queue_wait_seconds"] = {
            p.ts: finite(p.value)
            for p in hub.store.series(QUEUE_WAIT, {"partition": part}, start, end, points)
        }
        ts = sorted({t for col in cols.values() for t in col})
        history: dict[str, list[Any]] = {"ts": ts, **{k: [col.get(t) for t in ts] for k, col in cols.items()}}
        demand = [_add(a, b) for a, b in zip(history["gpus_pending"], history["gpus_running"], strict=True)]
        capacity = [
            _sub(a, b) for a, b in zip(history["gpus_total"], history["gpus_unavailable"], strict=True)
        ]
        history["demand_gpus"], history["capacity_gpus"] = demand, capacity
        wait = waits.get(part)
        out.append(
            {
                "partition": part,
                "queue_wait_seconds": {
                    "mean": finite(wait["mean"]) if wait else None,
                    "max": finite(wait["max"]) if wait else None,
                },
                "demand_gpus": {
                    "mean": _mean(demand),
                    "max": max((v for v in demand if v is not None), default=None),
                },
                "capacity_gpus": {
                    "mean": _mean(capacity),
                    "min": min((v for v in capacity if v is not None), default=None),
                },
                "history": history,
            }
        )
    return out


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None else a - (b or 0.0)


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(sum(got) / len(got), 3) if got else None


def waste_ranking(hub: Hub, start: float, end: float, top: int = 10) -> dict[str, Any]:
    """Wasted GPU-hours and dollars ranked by cause, team and job (from the productivity model)."""
    model = hub.productivity
    fleet = model.summary("fleet", start, end)["groups"]

    def ranked(by: str) -> list[dict[str, Any]]:
        rows = [r for r in model.summary(by, start, end)["groups"] if r["waste"]["gpu_hours"] > 0]
        return [{"group": r["group"], **r["waste"], "gpu_hours_total": r["gpu_hours"]} for r in rows[:top]]

    return {
        "total": fleet[0]["waste"] if fleet else {"gpu_hours": 0.0, "dollars": 0.0},
        "states": {s: v["gpu_hours"] for s, v in fleet[0]["states"].items()} if fleet else {},
        "by_cause": model.waste_by_cause(start, end)[:top],
        "by_team": ranked("team"),
        "by_job": ranked("job"),
    }


def failing_candidates(history: list[Any], start: float, top: int = 20) -> list[dict[str, Any]]:
    """GPUs ranked by their hardware alerts in the window (P1 counts 3, P2 2, P3 1)."""
    scores: dict[tuple[str, str], dict[str, Any]] = {}
    for alert in history:
        e = alert.entity
        if alert.rule not in HARDWARE_RULES or "gpu" not in e or "node" not in e:
            continue
        if (alert.resolved_at or alert.started_at) < start:
            continue
        key = (e["node"], e["gpu"])
        row = scores.setdefault(key, {"node": key[0], "gpu": key[1], "score": 0, "rules": {}, "firing": 0})
        row["score"] += SEVERITY_RANK.get(alert.severity, 1)
        row["rules"][alert.rule] = row["rules"].get(alert.rule, 0) + 1
        row["firing"] += 1 if alert.firing else 0
    ranked = sorted(
        scores.values(), key=lambda r: (-r["score"], natural_key(r["node"]), natural_key(r["gpu"]))
    )
    return ranked[:top]
