"""The fleet page's data: every GPU's latest value of one metric, its health, and idle cost.

Staleness is judged against the newest sample in the fleet rather than the wall clock, so a hub
whose ingest paused (or a simulated run replayed later) does not paint every GPU as lost; only a
GPU that fell silent while its peers kept reporting does.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from gpuscope.hub import Hub
from gpuscope.model import Alert
from gpuscope.productivity.states import owner_of
from gpuscope.rules import GPU_IDLE_ALLOCATED, spec
from gpuscope.signals import GPU_METRICS
from gpuscope.web.dashboard.common import AlertIndex, alert_brief, faulty_part, finite, natural_key

UTIL = "gpu_utilization_percent"
IDLE_UTIL_PERCENT = 5.0
#: label keys a per-GPU entity may carry; finer entities (per link, per process) are left out
GPU_ENTITY_KEYS = frozenset({"node", "gpu", "uuid", "job", "pod", "container", "namespace", "cluster"})
#: metrics offered by the picker: gauges a heatmap can colour sensibly
PICKER_METRICS = tuple(name for name, spec in GPU_METRICS.items() if spec.kind == "gauge")


def fleet_view(
    hub: Hub, metric: str, stale_after: float, window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """One entry per node with its GPUs in index order, each ``[gpu, value, state, job, idle,
    productivity state, cause]``; states: P1/P2/P3 (worst firing alert naming the GPU), stale, ok.
    ``productivity``: the fleet's GPU-hours and dollars per state and cause over ``window``."""
    now_states = {(g["node"], g["gpu"]): g for g in hub.productivity.gpu_states()}
    rows = hub.store.snapshot(list(dict.fromkeys([metric, UTIL])), None)
    node_rows = hub.store.snapshot(["node_cpu_percent"], None)
    gpu_rows = [r for r in rows if "gpu" in r["labels"] and "node" in r["labels"]]
    gpu_rows = [r for r in gpu_rows if GPU_ENTITY_KEYS.issuperset(r["labels"])]
    newest = max((r["ts"] for r in [*gpu_rows, *node_rows]), default=None)
    index = AlertIndex(hub.firing())
    price = hub.alerts.price_per_gpu_hour
    nodes: dict[str, list[list[Any]]] = {r["labels"]["node"]: [] for r in node_rows if "node" in r["labels"]}
    node_seen = {r["labels"]["node"]: r["ts"] for r in node_rows if "node" in r["labels"]}
    lo = hi = None
    idle: list[dict[str, Any]] = []
    alerted = bool(index.by_gpu)
    for row in gpu_rows:
        labels = row["labels"]
        node, gpu = labels["node"], labels["gpu"]
        values = row["values"]
        value = values.get(metric)
        if value is not None and not math.isfinite(value):
            value = None
        util = values.get(UTIL)
        stale = newest is not None and newest - row["ts"] > stale_after
        state = (index.gpu_severity(node, gpu) if alerted else None) or ("stale" if stale else "ok")
        is_idle = not stale and util is not None and util < IDLE_UTIL_PERCENT
        job = labels.get("job")
        now = now_states.get((node, gpu), {})
        if is_idle:
            idle.append({"node": node, "gpu": gpu, "job": job, "owner": idle_owner(now.get("owner"), job)})
        if value is not None and not stale:
            lo = value if lo is None or value < lo else lo
            hi = value if hi is None or value > hi else hi
        # one short list per GPU keeps 8,192 GPUs a small payload
        nodes.setdefault(node, []).append(
            [gpu, value, state, job, is_idle, now.get("state"), now.get("cause")]
        )
    out_nodes = []
    for node in sorted(nodes, key=natural_key):
        gpus = sorted(nodes[node], key=lambda g: (len(g[0]), g[0]))
        seen = node_seen.get(node)
        node_stale = seen is not None and newest is not None and newest - seen > stale_after
        badge = index.node_severity(node) or ("stale" if node_stale else "ok")
        alerts = len(index.by_node.get(node, []))
        states = Counter(g[5] for g in gpus if g[5])
        out_nodes.append({"node": node, "badge": badge, "alerts": alerts, "gpus": gpus, "states": states})
    allocated = [g for g in idle if g["job"]]
    firing = hub.firing()
    return {
        "metric": metric,
        "newest_ts": newest,
        "stale_after": stale_after,
        "price_per_gpu_hour": price,
        "range": [lo, hi],
        "nodes": out_nodes,
        "idle": {
            "threshold_percent": IDLE_UTIL_PERCENT,
            "allocated": len(allocated),
            "unallocated": len(idle) - len(allocated),
            "cost_per_hour": round(len(idle) * price, 2),
            "allocated_cost_per_hour": round(len(allocated) * price, 2),
            "gpus": sorted(idle, key=lambda g: (natural_key(g["node"]), len(g["gpu"]), g["gpu"]))[:200],
        },
        "summary": {
            "nodes": len(out_nodes),
            "gpus": len(gpu_rows),
            "firing": {sev: sum(1 for a in firing if a.severity == sev) for sev in ("P1", "P2", "P3")},
        },
        "owners": firing_by_owner(firing),
        "metrics": list(PICKER_METRICS),
        "states_now": Counter(g["state"] for g in now_states.values()),
        "productivity": _fleet_hours(hub, window),
        "waste_by_cause": [] if window is None else hub.productivity.waste_by_cause(*window)[:8],
    }


def idle_owner(model_owner: str | None, job: str | None) -> str:
    """Who must act on an idle GPU: the owner of its cause in the productivity model (a dead
    rank's GPUs are the model team's), else the owner of the rule an idle allocation raises, or
    of free capacity."""
    if model_owner:
        return model_owner
    return spec(GPU_IDLE_ALLOCATED).owner if job else owner_of("no_job")


def firing_by_owner(firing: list[Alert]) -> list[dict[str, Any]]:
    """Per owning team (the alert rule's owner, as routing and the alerts page name it): firing
    alerts per tier, their cost of delay and rules; the team with the gravest work first."""
    rows: dict[str, dict[str, Any]] = {}
    for alert in firing:
        row = rows.setdefault(
            alert.owner, {"owner": alert.owner, "P1": 0, "P2": 0, "P3": 0, "cost_per_hour": 0.0, "rules": {}}
        )
        row[alert.severity] = row.get(alert.severity, 0) + 1
        row["cost_per_hour"] += finite(alert.cost_per_hour) or 0.0
        row["rules"][alert.rule] = row["rules"].get(alert.rule, 0) + 1
    for row in rows.values():
        row["cost_per_hour"] = round(row["cost_per_hour"], 2)
    return sorted(
        rows.values(), key=lambda r: (-r["P1"], -r["P2"], -r["P3"], -r["cost_per_hour"], r["owner"])
    )


def _fleet_hours(hub: Hub, window: tuple[float, float] | None) -> dict[str, Any] | None:
    if window is None:
        return None
    rows = hub.productivity.summary("fleet", *window)["groups"]
    return rows[0] if rows else None


def node_view(hub: Hub, node: str, stale_after: float) -> dict[str, Any]:
    """A node's host values, its GPUs' latest values, the alerts that name it and those of the
    jobs and services running on it."""
    rows = [r for r in hub.store.snapshot(None, None) if r["labels"].get("node") == node]
    if not rows:
        raise KeyError(node)
    newest = max(r["ts"] for r in rows)
    index = AlertIndex(hub.firing())
    now_states = {g["gpu"]: g for g in hub.productivity.gpu_states() if g["node"] == node}
    host = next((r for r in rows if set(r["labels"]) == {"node"}), None)
    gpus = []
    services = []
    for row in rows:
        labels = row["labels"]
        if "service" in labels:
            services.append({"labels": labels, "values": row["values"], "ts": row["ts"]})
        if "gpu" not in labels or not GPU_ENTITY_KEYS.issuperset(labels):
            continue
        pstate = now_states.get(labels["gpu"], {})
        # a GPU the model counts lost (or its node unreachable) shows its last values as stale at once
        stale = newest - row["ts"] > stale_after or bool(pstate.get("stale"))
        gpus.append(
            {
                "stale": stale,
                "pstate": pstate.get("state"),
                "cause": pstate.get("cause"),
                "gpu": labels["gpu"],
                "uuid": labels.get("uuid"),
                "job": labels.get("job"),
                "state": index.gpu_severity(node, labels["gpu"]) or ("stale" if stale else "ok"),
                # slow since it started, past what parts differ by: its P2's lag and cost, shown apart
                "faulty": next(
                    (f for a in index.by_gpu.get((node, labels["gpu"]), []) if (f := faulty_part(a))),
                    None,
                ),
                "ts": row["ts"],
                "values": {k: finite(v) for k, v in row["values"].items() if k.startswith("gpu_")},
            }
        )
    gpus.sort(key=lambda g: natural_key(g["gpu"]))
    own = index.by_node.get(node, [])
    # the node's work too: an alert on a job or service running here that names no node of its
    # own (the node was "no firing alerts" while its GPUs' job idled and its service failed)
    jobs = sorted({g["job"] for g in gpus if g["job"]})
    names = sorted({s["labels"]["service"] for s in services})
    work = [a for j in jobs for a in index.by_job.get(j, [])]
    work += [a for n in names for a in index.by_service.get(n, [])]
    listed = {a.id: a for a in own}
    for alert in work:
        if "node" not in alert.entity:
            listed.setdefault(alert.id, alert)
    alerts = sorted(listed.values(), key=lambda a: (a.severity, a.started_at))
    return {
        "node": node,
        "host": None if host is None else {"ts": host["ts"], "values": host["values"]},
        "gpus": gpus,
        "services": services,
        "alerts": [alert_brief(a) for a in alerts],
    }
