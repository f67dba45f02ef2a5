"""Playbook checks that data can answer, evaluated against the hub's store when an alert fires.

Each check is a function registered under the name a playbook step uses. It reads the store (and
the detector's own details on the alert) as of the firing time, and returns a result a person can
act on: ``found`` (something relevant, e.g. a likely root cause), ``clear`` (looked, nothing there)
or ``unknown`` (no data to say). A check never raises into the alert path: errors become ``unknown``.

The store's answers are shared through :class:`Reads` by the playbooks of alerts triaged together:
alerts that fire together (an outage) ask the same questions, and one whole-store snapshot per
alert cost 100 ms of CPU at 3,072 GPUs (``bench/bench_alert_burst.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

from gpuscope.alert.training_reads import training_slices
from gpuscope.model import Alert, Event, Labels
from gpuscope.rules import RULES
from gpuscope.store.base import Store

FAULT_EVENTS = ("xid", "gpu_lost", "ecc_dbe")
#: hardware faults that may explain another alert on the node: the hardware layer's P1 and P2 rules
FAULT_RULES = frozenset(name for name, s in RULES.items() if s.layer == "hardware" and s.tier != "P3")
BUSY_PERCENT = 20.0


#: labels the snapshot is indexed by: what the checks select rows with
INDEXED = ("node", "job", "service")
#: how long the store's answers are shared: playbooks read the fleet as of their alert's firing
READS_FRESH_S = 1.0


class Reads:
    """The store's answers to playbook checks, shared by the playbooks run within
    :data:`READS_FRESH_S` of each other: the latest value of every entity (read once, indexed by
    node, job and service) and event queries (each distinct query read once)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.taken_at = clock()
        self._snapshot: list[dict[str, Any]] | None = None
        self._index: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._events: dict[tuple[Any, ...], list[Event]] = {}

    def fresh(self) -> bool:
        return self.clock() - self.taken_at < READS_FRESH_S

    def snapshot(self) -> list[dict[str, Any]]:
        if self._snapshot is None:
            self._snapshot = self.store.snapshot()
            for row in self._snapshot:
                labels = row["labels"]
                for key in INDEXED:
                    value = labels.get(key)
                    if value is not None:
                        self._index.setdefault((key, value), []).append(row)
        return self._snapshot

    def rows(self, key: str, value: str) -> list[dict[str, Any]]:
        """The snapshot's rows whose label ``key`` (one of :data:`INDEXED`) is ``value``."""
        self.snapshot()
        return self._index.get((key, value), [])

    def events(
        self, start: float, end: float, kind: str, labels: Labels | None = None, limit: int = 1000
    ) -> list[Event]:
        key = (start, end, kind, tuple(sorted(labels.items())) if labels else (), limit)
        found = self._events.get(key)
        if found is None:
            found = self._events[key] = self.store.events(start, end, kind, labels, limit)
        return found


@dataclass(slots=True)
class Context:
    alert: Alert
    store: Store
    now: float
    firing: list[Alert] = field(default_factory=list)
    lookback: float = 600.0
    #: the store's answers shared with other playbooks (None: this one reads afresh)
    shared: InitVar[Reads | None] = None
    reads: Reads = field(init=False)

    def __post_init__(self, shared: Reads | None) -> None:
        self.reads = shared if shared is not None else Reads(self.store)

    def snapshot(self) -> list[dict[str, Any]]:
        return self.reads.snapshot()

    def rows(self, key: str, value: str) -> list[dict[str, Any]]:
        return self.reads.rows(key, value)

    def job_gpus(self, job: str) -> list[dict[str, Any]]:
        return [r for r in self.rows("job", job) if "gpu" in r["labels"]]

    def nodes(self) -> set[str]:
        """The nodes an alert touches: its own, its declared links, its job's or service's."""
        e = self.alert.entity
        out = {e["node"]} if "node" in e else set()
        links = self.alert.details.get("links")
        if isinstance(links, list):
            out |= {str(x["node"]) for x in links if isinstance(x, dict) and "node" in x}
        if not out and "job" in e:
            out |= {r["labels"]["node"] for r in self.job_gpus(e["job"]) if "node" in r["labels"]}
        if not out and "service" in e:
            out |= {r["labels"]["node"] for r in self.rows("service", e["service"]) if "node" in r["labels"]}
        return out


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: str  # found | clear | unknown
    text: str
    data: dict[str, Any] = field(default_factory=dict)


CheckFn = Callable[[Context], CheckResult]
CHECKS: dict[str, CheckFn] = {}


def check(name: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        CHECKS[name] = fn
        return fn

    return register


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _gpu_row(ctx: Context, node: str, gpu: str) -> dict[str, Any] | None:
    return next((r for r in ctx.rows("node", node) if r["labels"].get("gpu") == gpu), None)


def when(ts: float) -> str:
    """A timestamp as people read it (UTC), never raw epoch seconds."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def readable(key: str, value: Any) -> str:
    """A detail value for a playbook line: times as dates, floats to 4 significant digits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if (key == "ts" or key.endswith("_ts")) and math.isfinite(value) and value > 1e8:
        return when(float(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@check("alert_details")
def alert_details(ctx: Context) -> CheckResult:
    details = {k: v for k, v in ctx.alert.details.items() if k not in {"links", "playbook", "ack"}}
    if not details:
        return CheckResult("unknown", "the detector attached no details")
    text = ", ".join(
        f"{k}={readable(k, v)}" for k, v in sorted(details.items()) if not isinstance(v, dict | list)
    )
    return CheckResult("found", text or "see data", details)


@check("job_gpu_utilization")
def job_gpu_utilization(ctx: Context) -> CheckResult:
    job = ctx.alert.entity.get("job")
    if job is None:
        return CheckResult("unknown", "the alert names no job")
    values = [
        v
        for r in ctx.job_gpus(job)
        if (v := _finite(r["values"].get("gpu_utilization_percent"))) is not None
        and r["ts"] >= ctx.now - ctx.lookback
    ]
    if not values:
        util = _finite(ctx.alert.details.get("gpu_utilization_percent"))
        if util is None:
            return CheckResult("unknown", f"no recent GPU utilization for job {job}")
        values = [util]
    mean = sum(values) / len(values)
    busy = mean >= BUSY_PERCENT
    state = "busy (but not progressing if stalled: likely a hang in a collective)" if busy else "idle"
    return CheckResult(
        "found",
        f"{len(values)} GPUs of job {job} at {mean:.0f}% mean utilization: {state}",
        {"gpus": len(values), "mean_percent": mean, "min_percent": min(values), "busy": busy},
    )


@check("last_checkpoint")
def last_checkpoint(ctx: Context) -> CheckResult:
    job = ctx.alert.entity.get("job")
    if job is None:
        return CheckResult("unknown", "the alert names no job")
    since = ctx.now - 7 * 86400
    verified = [
        e
        for e in ctx.reads.events(since, ctx.now, "checkpoint_verified", {"job": job})
        if e.data.get("ok", True)
    ]
    if verified:
        last = verified[-1]
        age = ctx.now - last.ts
        return CheckResult(
            "found",
            f"last verified checkpoint at step {last.data.get('step', '?')}, {age:.0f} s before the alert",
            {"seconds_since": age, "step": last.data.get("step"), "verified": True},
        )
    completed = ctx.reads.events(since, ctx.now, "checkpoint_completed", {"job": job})
    if completed:
        last = completed[-1]
        age = ctx.now - last.ts
        return CheckResult(
            "found",
            f"no verified checkpoint; last completed save at step {last.data.get('step', '?')}, "
            f"{age:.0f} s ago",
            {"seconds_since": age, "step": last.data.get("step"), "verified": False},
        )
    return CheckResult("found", f"no checkpoint of job {job} on record: all work so far is at risk", {})


@check("faults_nearby")
def faults_nearby(ctx: Context) -> CheckResult:
    nodes = ctx.nodes()
    if not nodes:
        return CheckResult("unknown", "the alert is not placed on any node")
    start = ctx.now - ctx.lookback
    events = [
        e
        for kind in FAULT_EVENTS
        for e in ctx.reads.events(start, ctx.now, kind)
        if e.labels.get("node") in nodes
    ]
    alerts = [
        a
        for a in ctx.firing
        if a.id != ctx.alert.id and a.rule in FAULT_RULES and a.entity.get("node") in nodes
    ]
    if not events and not alerts:
        return CheckResult(
            "clear",
            f"no XID, lost GPU or ECC fault on {', '.join(sorted(nodes))} in the last {ctx.lookback:.0f} s",
        )
    parts = [
        f"{e.kind}{' ' + str(e.data['code']) if 'code' in e.data else ''} on {e.labels.get('node')} "
        f"GPU {e.labels.get('gpu', '?')} at {when(e.ts)}"
        for e in sorted(events, key=lambda e: e.ts)[:5]
    ]
    parts += [f"{a.rule} firing on {a.entity.get('node')} GPU {a.entity.get('gpu', '-')}" for a in alerts[:5]]
    return CheckResult(
        "found",
        "likely root cause: " + "; ".join(parts),
        {
            "events": [{"kind": e.kind, "ts": e.ts, "labels": e.labels, "data": e.data} for e in events[:20]],
            "alerts": [a.id for a in alerts],
        },
    )


@check("first_stopped_rank")
def first_stopped_rank(ctx: Context) -> CheckResult:
    first = ctx.alert.details.get("first_silent_rank")
    if isinstance(first, dict) and "rank" in first:
        return CheckResult(
            "found",
            f"rank {first['rank']} on {first.get('node')} GPU {first.get('gpu')} stopped first",
            first,
        )
    job = ctx.alert.entity.get("job")
    if job is None:
        return CheckResult("unknown", "the alert names no job")
    last: dict[int, tuple[float, int]] = {}  # rank -> its newest record's (ts, step)
    oldest: dict[int, float] = {}  # rank -> its oldest record's ts
    for records in training_slices(ctx.store, job, ctx.now - ctx.lookback, ctx.now, 100_000):
        # slices come newest first, each oldest first
        in_slice = {rec.rank: (rec.ts, rec.step) for rec in records}
        for r, seen in in_slice.items():
            last.setdefault(r, seen)
        oldest.update({rec.rank: rec.ts for rec in reversed(records)})
    if len(last) < 2:
        return CheckResult("unknown", f"too few ranks of job {job} reported recently")
    # of ranks whose newest records are equally old, the one that appeared first in the window
    # (then the lower rank): what a single pass over the window, oldest first, would choose
    rank = min(last, key=lambda r: (last[r][0], oldest[r], r))
    ts, step = last[rank]
    newest = max(t for t, _ in last.values())
    if newest - ts < 2.0:
        return CheckResult("clear", f"all {len(last)} ranks stopped together (at step {step})")
    return CheckResult(
        "found",
        f"rank {rank} stopped first, at step {step}, {newest - ts:.0f} s before the others",
        {"rank": rank, "step": step, "last_ts": ts},
    )


_TREND_METRICS = ("step_seconds", "loss")


@check("training_trend")
def training_trend(ctx: Context) -> CheckResult:
    job = ctx.alert.entity.get("job")
    if job is None:
        return CheckResult("unknown", "the alert names no job")
    cut = ctx.now - ctx.lookback / 5
    last_step: int | None = None
    values: dict[tuple[str, bool], list[float]] = {(m, r): [] for m in _TREND_METRICS for r in (False, True)}
    for records in training_slices(ctx.store, job, ctx.now - 6 * ctx.lookback, ctx.now, 50_000):
        top = max(r.step for r in records)
        last_step = top if last_step is None else max(last_step, top)
        for metric in _TREND_METRICS:
            for r in records:
                if (v := _finite(r.metrics.get(metric))) is not None:
                    values[metric, r.ts >= cut].append(v)
    if last_step is None:
        return CheckResult("unknown", f"no training records of job {job}")
    out: dict[str, Any] = {"last_step": last_step}
    for metric in _TREND_METRICS:
        before, recent = values[metric, False], values[metric, True]
        if before and recent:
            out[metric] = {"before": statistics.median(before), "recent": statistics.median(recent)}
    parts = [f"{m} {v['before']:.3g} -> {v['recent']:.3g}" for m, v in out.items() if isinstance(v, dict)]
    text = f"last step {out['last_step']}" + (f"; {', '.join(parts)} (median before/recent)" if parts else "")
    return CheckResult("found", text, out)


@check("gpu_state")
def gpu_state(ctx: Context) -> CheckResult:
    node, gpu = ctx.alert.entity.get("node"), ctx.alert.entity.get("gpu")
    if node is None or gpu is None:
        return CheckResult("unknown", "the alert is not placed on a GPU")
    row = _gpu_row(ctx, node, gpu)
    if row is None:
        return CheckResult("unknown", f"no telemetry from {node} GPU {gpu}")
    keys = ("gpu_temp_celsius", "gpu_power_watts", "gpu_sm_clock_mhz", "gpu_utilization_percent")
    values = {k: row["values"][k] for k in keys if k in row["values"]}
    errors = {
        k: v for k, v in row["values"].items() if ("ecc" in k or "replay" in k or "nvlink_err" in k) and v
    }
    age = ctx.now - row["ts"]
    text = ", ".join(f"{k}={v:.0f}" for k, v in values.items()) + f" ({age:.0f} s old)"
    if errors:
        text += "; error counters: " + ", ".join(f"{k}={v:.0f}" for k, v in errors.items())
    return CheckResult("found" if errors else "clear", text, {**values, **errors, "age_seconds": age})


@check("gpu_vs_peers")
def gpu_vs_peers(ctx: Context) -> CheckResult:
    node, gpu = ctx.alert.entity.get("node"), ctx.alert.entity.get("gpu")
    if node is None or gpu is None:
        return CheckResult("unknown", "the alert is not placed on a GPU")
    peers = [r for r in ctx.rows("node", node) if "gpu" in r["labels"]]
    mine = next((r for r in peers if r["labels"]["gpu"] == gpu), None)
    if mine is None or len(peers) < 2:
        return CheckResult("unknown", f"not enough GPUs reporting on {node} to compare")
    out: dict[str, Any] = {}
    for metric in ("gpu_temp_celsius", "gpu_power_watts", "gpu_sm_clock_mhz"):
        others = [v for r in peers if r is not mine and (v := _finite(r["values"].get(metric))) is not None]
        value = _finite(mine["values"].get(metric))
        if others and value is not None:
            out[metric] = {"gpu": value, "peer_median": statistics.median(others)}
    if not out:
        return CheckResult("unknown", "no comparable telemetry")
    text = "; ".join(f"{m} {v['gpu']:.0f} vs peers {v['peer_median']:.0f}" for m, v in out.items())
    return CheckResult("found", text, out)


def _workloads(ctx: Context, where: Labels) -> CheckResult:
    rows = [
        r for r in ctx.rows("node", where["node"]) if all(r["labels"].get(k) == v for k, v in where.items())
    ]
    jobs = sorted({r["labels"]["job"] for r in rows if "job" in r["labels"]})
    services = sorted({r["labels"]["service"] for r in rows if "service" in r["labels"]})
    place = " ".join(f"{k}={v}" for k, v in where.items())
    if not jobs and not services:
        return CheckResult("clear", f"no job or service seen on {place}")
    text = f"on {place}: " + ", ".join([*(f"job {j}" for j in jobs), *(f"service {s}" for s in services)])
    return CheckResult("found", text, {"jobs": jobs, "services": services})


@check("workloads_on_gpu")
def workloads_on_gpu(ctx: Context) -> CheckResult:
    node, gpu = ctx.alert.entity.get("node"), ctx.alert.entity.get("gpu")
    if node is None or gpu is None:
        return CheckResult("unknown", "the alert is not placed on a GPU")
    return _workloads(ctx, {"node": node, "gpu": gpu})


@check("workloads_on_node")
def workloads_on_node(ctx: Context) -> CheckResult:
    node = ctx.alert.entity.get("node")
    if node is None:
        return CheckResult("unknown", "the alert is not placed on a node")
    return _workloads(ctx, {"node": node})


@check("related_alerts")
def related_alerts(ctx: Context) -> CheckResult:
    nodes = ctx.nodes()
    e = ctx.alert.entity
    related = [
        a
        for a in ctx.firing
        if a.id != ctx.alert.id
        and (
            a.entity.get("node") in nodes
            or (e.get("job") is not None and a.entity.get("job") == e.get("job"))
            or (e.get("service") is not None and a.entity.get("service") == e.get("service"))
        )
    ]
    if not related:
        return CheckResult("clear", "no other alert firing on the same nodes, job or service")
    text = "; ".join(
        f"{a.rule} ({a.severity}) on {', '.join(f'{k}={v}' for k, v in a.entity.items())}"
        for a in related[:8]
    )
    return CheckResult("found", text, {"alerts": [a.id for a in related]})


@check("recent_promotion")
def recent_promotion(ctx: Context) -> CheckResult:
    service = ctx.alert.entity.get("service")
    if service is None:
        return CheckResult("unknown", "the alert names no service")
    events = ctx.reads.events(ctx.now - 6 * 3600, ctx.now, "model_version_promoted", {"service": service})
    if not events:
        return CheckResult("clear", f"no version promoted on service {service} in the last 6 h")
    last = events[-1]
    version = last.data.get("version", last.labels.get("version", "?"))
    return CheckResult(
        "found",
        f"version {version} promoted {ctx.now - last.ts:.0f} s before the alert",
        {"version": version, "seconds_before": ctx.now - last.ts},
    )


@check("service_state")
def service_state(ctx: Context) -> CheckResult:
    service = ctx.alert.entity.get("service")
    if service is None:
        return CheckResult("unknown", "the alert names no service")
    rows = ctx.rows("service", service)
    if not rows:
        return CheckResult("unknown", f"no telemetry from service {service}")
    merged: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["values"].items():
            if (x := _finite(v)) is not None:
                merged.setdefault(k, []).append(x)
    summary = {k: statistics.mean(v) for k, v in sorted(merged.items())}
    text = ", ".join(f"{k}={v:.3g}" for k, v in list(summary.items())[:8])
    return CheckResult("found", f"{len(rows)} replicas: {text}", summary)
