"""The jobs pages' data: which jobs ran, and per job its ranks' curves, checkpoints and goodput.

Per-rank curves are bucketed here (mean per bucket) so a 1,000-rank job still answers with a
bounded payload; the straggler is the one a firing or recent alert names, else the rank that
arrives last at the collectives by a clear margin and is not on a slow placement (a firing P3 says
its pace is its GPU's or its group's, not a live fault).
"""

from __future__ import annotations

import statistics
from typing import Any

from gpuscope.detect.jobs import gpu_of, place_labels
from gpuscope.hub import Hub
from gpuscope.model import Alert, Event, TrainingRecord
from gpuscope.rules import GPU_UNDERPERFORMING, SLOW_PLACEMENT, STEP_TIME_REGRESSION, TRAINING_STRAGGLER
from gpuscope.web.dashboard.common import AlertIndex, alert_brief, faulty_part, finite, natural_key, worst

JOB_EVENTS = ("job_started", "job_ended", "job_failed")
CHECKPOINT_EVENTS = ("checkpoint_started", "checkpoint_completed", "checkpoint_failed", "checkpoint_verified")
CURVES = ("loss", "grad_norm", "step_seconds")
LOOKBACK_SECONDS = 30 * 86400.0
STRAGGLER_SKEW_FACTOR = 3.0
ARRIVAL_METRICS = ("collective_arrival_gap_seconds", "collective_arrival_skew_seconds")


def _job_events(hub: Hub, end: float, job: str | None = None) -> list[Event]:
    labels = {"job": job} if job else None
    out: list[Event] = []
    for kind in JOB_EVENTS:
        out += hub.store.events(end - LOOKBACK_SECONDS, end, kind, labels, 10_000)
    return sorted(out, key=lambda e: e.ts)


def jobs_view(hub: Hub, now: float) -> dict[str, Any]:
    """Every job seen in the last 30 days: kind, state, size, GPUs held now and its alerts."""
    jobs: dict[str, dict[str, Any]] = {}
    for ev in _job_events(hub, now):
        name = ev.labels.get("job")
        if not name:
            continue
        job = jobs.setdefault(name, {"job": name, "kind": None, "first_start": ev.ts, "restarts": -1})
        if ev.kind == "job_started":
            job["kind"] = ev.data.get("kind", job["kind"])
            job["world_size"] = ev.data.get("world_size", len(ev.data.get("placement", [])) or None)
            job["restarts"] += 1
            job["state"] = "running"
            job["started_at"] = ev.ts
        else:
            job["state"] = "ended" if ev.kind == "job_ended" else "failed"
            job["ended_at"] = ev.ts
    held: dict[str, int] = {}
    for row in hub.store.snapshot(["gpu_utilization_percent"], None):
        name = row["labels"].get("job")
        if name and "gpu" in row["labels"]:
            held[name] = held.get(name, 0) + 1
    index = AlertIndex(hub.firing())
    out = []
    for name in sorted(jobs, key=natural_key):
        job = jobs[name]
        alerts = index.by_job.get(name, [])
        job["status"] = job_status(hub, name, now, alerts, job.get("state", "running"))
        job["restarts"] = max(0, job["restarts"])
        job["gpus_now"] = held.get(name, 0)
        job["alerts"] = len(alerts)
        job["worst"] = worst(a.severity for a in alerts)
        out.append(job)
    return {"jobs": out}


#: firing alerts that settle a job's status whatever the GPUs show (the alert text and the list agree)
STALL_RULES = frozenset({"training_stalled", "rank_lost"})
DEGRADE_RULES = frozenset({TRAINING_STRAGGLER, STEP_TIME_REGRESSION, GPU_UNDERPERFORMING})


def job_status(hub: Hub, job: str, now: float, alerts: list[Alert], lifecycle_state: str) -> str:
    """running, stalled, degraded, failed or finished: the productivity model's view of the job's
    GPUs, overridden by a firing stall/failure alert so the list never contradicts the alerts."""
    rules = {a.rule for a in alerts}
    if "job_failed" in rules or lifecycle_state == "failed":
        return "failed"
    if lifecycle_state == "ended":
        return "finished"
    if rules & STALL_RULES:
        return "stalled"
    status = hub.productivity.job_status(job, now)
    if status in ("running", "stalled", "degraded"):
        return "degraded" if status == "running" and rules & DEGRADE_RULES else status
    return "running"


def _bucketed(
    records: list[TrainingRecord], start: float, end: float, points: int
) -> tuple[list[float], list[int], dict[str, dict[int, list[float | None]]]]:
    """Mean of each curve per rank per time bucket, on one shared time axis."""
    width = max((end - start) / points, 1e-9)
    ranks = sorted({r.rank for r in records})
    sums: dict[str, dict[int, dict[int, list[float]]]] = {c: {} for c in CURVES}
    used: set[int] = set()
    for rec in records:
        b = min(points - 1, max(0, int((rec.ts - start) / width)))
        used.add(b)
        for curve in CURVES:
            v = finite(rec.metrics.get(curve))
            if v is not None:
                acc = sums[curve].setdefault(rec.rank, {}).setdefault(b, [0.0, 0.0])
                acc[0] += v
                acc[1] += 1
    buckets = sorted(used)
    xs = [start + (b + 0.5) * width for b in buckets]
    curves: dict[str, dict[int, list[float | None]]] = {}
    for curve in CURVES:
        curves[curve] = {}
        for rank in ranks:
            per = sums[curve].get(rank, {})
            curves[curve][rank] = [per[b][0] / per[b][1] if b in per else None for b in buckets]
    return xs, ranks, curves


def _stragglers(
    hub: Hub, job: str, records: list[TrainingRecord], placed: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """Ranks a straggler alert names (firing first, then the latest), else the one arriving last
    unless a firing slow_placement names it (``placed``): a rank on a GPU slower from its start
    arrives last at every collective, and the page called it a straggler beside the P3 that says
    it is no live fault."""
    named = [
        a
        for a in hub.stored_alerts(False, 2000)
        if a.rule == "training_straggler" and a.entity.get("job") == job
    ]
    if named:
        named.sort(key=lambda a: (not a.firing, -a.started_at))
        seen: dict[int, dict[str, Any]] = {}
        for alert in named:
            rank = int(alert.entity["rank"])
            seen.setdefault(rank, {"rank": rank, "source": alert.id, "firing": alert.firing})
        return list(seen.values())
    # the SDK reports each rank's own arrival gap (collective_arrival_gap_seconds); older SDKs the
    # skew after the first rank (collective_arrival_skew_seconds). Minus the earliest rank's, a gap
    # is the same skew: collectives end together on every rank.
    medians = max((_rank_medians(records, name) for name in ARRIVAL_METRICS), key=len)
    if len(medians) < 3:
        return []
    earliest = min(medians.values())
    skew = {rank: m - earliest for rank, m in medians.items()}
    typical = statistics.median(skew.values())
    candidates = [r for r in skew if r not in placed]
    if not candidates:
        return []
    rank = max(candidates, key=lambda r: skew[r])
    if skew[rank] > STRAGGLER_SKEW_FACTOR * max(typical, 1e-3):
        return [{"rank": rank, "source": "collective arrival skew", "firing": None}]
    return []


def _rank_medians(records: list[TrainingRecord], metric: str) -> dict[int, float]:
    values: dict[int, list[float]] = {}
    for rec in records:
        v = finite(rec.metrics.get(metric))
        if v is not None:
            values.setdefault(rec.rank, []).append(v)
    return {rank: statistics.median(vs) for rank, vs in values.items()}


def _slow_group(alerts: list[Alert]) -> dict[str, Any] | None:
    """The ranks a firing slow_placement of the job's ranks names: the job's pace, not a live fault.

    A slow placement of one GPU names no ranks; it is listed in :func:`_slow_placements` only (it
    used to be read here as a placement of no ranks, and hid the ranks' one when both fired)."""
    for alert in alerts:
        if alert.rule == SLOW_PLACEMENT and "gpu" not in alert.entity:
            return {
                "id": alert.id,
                "severity": alert.severity,
                "ranks": [int(r) for r in alert.details.get("slow_ranks", [])],
                "lost_share": finite(alert.details.get("lost_share")),
                "cost_per_hour": finite(alert.cost_per_hour),
            }
    return None


def _slow_placements(alerts: list[Alert], placement: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """Every firing slow_placement of the job: its ranks' group, and each GPU slower than its speed
    group with the ranks the job placed on it; the ranks' group first, then the GPUs by place."""
    out: list[dict[str, Any]] = []
    for alert in alerts:
        if alert.rule != SLOW_PLACEMENT:
            continue
        entry: dict[str, Any] = {
            "id": alert.id,
            "severity": alert.severity,
            "summary": alert.summary,
            "lost_share": finite(alert.details.get("lost_share")),
            "cost_per_hour": finite(alert.cost_per_hour),
        }
        node, gpu = alert.entity.get("node"), alert.entity.get("gpu")
        if node is not None and gpu is not None:
            at = place_labels(node, gpu)
            entry |= {
                "kind": "gpu",
                "node": node,
                "gpu": gpu,
                "ranks": sorted(r for r, p in placement.items() if p == at),
                "lag_share": finite(alert.details.get("lag_share", alert.value)),
            }
        else:
            entry |= {"kind": "ranks", "ranks": [int(r) for r in alert.details.get("slow_ranks", [])]}
        out.append(entry)
    return sorted(out, key=_placement_order)


def _faulty_gpus(alerts: list[Alert], placement: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """Each GPU of the job that has been a faulty part since it started (its P2), with the ranks the
    job placed on it, by place: the page names it apart from the alert rows, with its lag and cost."""
    out: list[dict[str, Any]] = []
    for alert in alerts:
        part = faulty_part(alert)
        if part is None or part["node"] is None or part["gpu"] is None:
            continue
        at = place_labels(part["node"], part["gpu"])
        out.append(part | {"ranks": sorted(r for r, p in placement.items() if p == at)})
    return sorted(out, key=lambda p: (natural_key(p["node"]), natural_key(p["gpu"])))


def _placement_order(entry: dict[str, Any]) -> tuple[bool, tuple[Any, ...], tuple[Any, ...]]:
    return (entry["kind"] == "gpu", natural_key(entry.get("node", "")), natural_key(entry.get("gpu", "")))


def _checkpoints(events: list[Event]) -> list[dict[str, Any]]:
    steps: dict[int, dict[str, Any]] = {}
    for ev in events:
        step = ev.data.get("step")
        if not isinstance(step, int):
            continue
        cp = steps.setdefault(step, {"step": step, "started": None, "completed": None, "ranks_done": 0})
        if ev.kind == "checkpoint_started":
            cp["started"] = ev.ts if cp["started"] is None else min(cp["started"], ev.ts)
        elif ev.kind == "checkpoint_completed":
            cp["completed"] = ev.ts if cp["completed"] is None else max(cp["completed"], ev.ts)
            cp["ranks_done"] += 1
        elif ev.kind == "checkpoint_failed":
            cp["failed"] = str(ev.data.get("reason", "failed"))
        elif ev.kind == "checkpoint_verified":
            cp["verified"] = bool(ev.data.get("ok"))
    return [steps[s] for s in sorted(steps)]


def goodput(
    records: list[TrainingRecord], checkpoints: list[dict[str, Any]], start: float, end: float
) -> dict[str, float]:
    """Where the window's wall time went, seen from the lowest rank present (all ranks step together).

    productive: step time less input waits; data_wait; checkpoint: first save start to last rank
    done; restart: steps computed again after a restart; stalled: what is left (hangs, lost ranks).
    """
    if not records:
        return {}
    lead = min(r.rank for r in records)
    own = sorted((r for r in records if r.rank == lead), key=lambda r: r.ts)
    elapsed = max(
        0.0, min(end, own[-1].ts) - max(start, own[0].ts - (finite(own[0].metrics.get("step_seconds")) or 0))
    )
    productive = data_wait = restart = 0.0
    best = -1
    for rec in own:
        step_s = finite(rec.metrics.get("step_seconds")) or 0.0
        wait = min(step_s, finite(rec.metrics.get("data_wait_seconds")) or 0.0)
        if rec.step <= best:
            restart += step_s
        else:
            productive += step_s - wait
            data_wait += wait
        best = max(best, rec.step)
    ckpt = sum(
        min(cp["completed"], end) - max(cp["started"], start)
        for cp in checkpoints
        if cp["started"] is not None and cp["completed"] is not None and cp["completed"] > cp["started"]
    )
    accounted = productive + data_wait + restart + ckpt
    elapsed = max(elapsed, accounted)
    stalled = elapsed - accounted
    return {
        "elapsed": elapsed,
        "productive": productive,
        "data_wait": data_wait,
        "checkpoint": ckpt,
        "restart": restart,
        # the rounding of the sums is no stall (the page read "stalled 0.0 % (9.3e-8 s)")
        "stalled": stalled if stalled > 1e-6 * elapsed else 0.0,
    }


def job_view(hub: Hub, job: str, start: float, end: float, points: int) -> dict[str, Any]:
    """A job's per-rank curves, its straggler, checkpoints, goodput, placement and alerts."""
    records = hub.store.training(job, start, end, None, 500_000)
    lifecycle = _job_events(hub, end, job)
    if not records and not lifecycle:
        raise KeyError(job)
    xs, ranks, curves = _bucketed(records, start, end, points)
    cp_events: list[Event] = []
    for kind in CHECKPOINT_EVENTS:
        cp_events += hub.store.events(start, end, kind, {"job": job}, 100_000)
    checkpoints = _checkpoints(sorted(cp_events, key=lambda e: e.ts))
    placement: dict[int, dict[str, str]] = {}
    for ev in lifecycle:
        for item in ev.data.get("placement", []) if ev.kind == "job_started" else []:
            placement[int(item[0])] = place_labels(str(item[1]), gpu_of(item[2]))
    for rec in records:
        if "node" in rec.labels:
            placement[rec.rank] = place_labels(rec.labels["node"], rec.labels.get("gpu", ""))
    last_step = max((r.step for r in records), default=None)
    index = AlertIndex(hub.firing())
    alerts = index.by_job.get(job, [])
    state = next((e.kind for e in reversed(lifecycle)), "job_started")
    lifecycle_state = {"job_ended": "ended", "job_failed": "failed"}.get(state, "running")
    mine = [g for g in hub.productivity.summary("job", start, end)["groups"] if g["group"] == job]
    placements = _slow_placements(alerts, placement)
    return {
        "status": job_status(hub, job, end, alerts, lifecycle_state),
        "productivity": mine[0] if mine else None,
        "job": job,
        "start": start,
        "end": end,
        "ts": xs,
        "ranks": ranks,
        "curves": {c: {str(r): v for r, v in per.items()} for c, per in curves.items()},
        "stragglers": _stragglers(hub, job, records, frozenset(r for p in placements for r in p["ranks"])),
        "slow_group": _slow_group(alerts),
        "slow_placements": placements,
        "faulty_gpus": _faulty_gpus(alerts, placement),
        "checkpoints": checkpoints,
        "goodput": goodput(records, checkpoints, start, end),
        "placement": {str(r): p for r, p in sorted(placement.items())},
        "last_step": last_step,
        "lifecycle": [
            {"ts": e.ts, "kind": e.kind, "data": {k: v for k, v in e.data.items() if k != "placement"}}
            for e in lifecycle
        ],
        "alerts": [
            alert_brief(a)
            for a in sorted(index.by_job.get(job, []), key=lambda a: (a.severity, a.started_at))
        ],
    }
