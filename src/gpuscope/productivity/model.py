"""The productivity model: every GPU-second the hub hears about gets one state, cause and owner.

It reads only what the hub already has: GPU telemetry frames (who holds each GPU, whether it
computes, whether it throttles), training records and job events (progress, checkpoints, restarts,
heartbeats), serving frames (which jobs are services), firing alerts (fatal XIDs) and node drains.
GPU allocations (the kubelet's ``gpu_owner_allocated`` rows, :mod:`~gpuscope.productivity.holders`)
say who holds a GPU that runs no job, and the team of a pod from its metadata.
The scheduler's node states (the Slurm collector's ``slurm_node_unavailable``) say which nodes are
held out of service. A GPU-second is counted when that GPU's own frame arrives (the frame's
interval, judged at its timestamp); a GPU that stops reporting is counted ``down`` from its last
frame once it is stale, so a lost GPU or an unreachable node is counted from when it went, not from
when it was noticed.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.settings import FINISHED_JOB_RETENTION_S, JOB_SWEEP_S
from gpuscope.model import Alert, Batch, FloatArray, Frame, positions
from gpuscope.productivity.holders import Holders
from gpuscope.productivity.jobs import JobView
from gpuscope.productivity.ledger import MINUTE, MINUTES_KEPT_S, RETENTION_S, Ledger, Slot
from gpuscope.productivity.states import DEGRADED_AT, owner_of, state_of
from gpuscope.store.base import GpuTime, Store
from gpuscope.store.errors import StoreError

#: a GPU silent for this many of its usual intervals (and at least STALE_MIN_S) is down
STALE_INTERVALS = 3.0
STALE_MIN_S = 3.0
#: below this utilisation a GPU computes nothing
IDLE_UTIL = 5.0
FATAL_RULES = frozenset({"gpu_xid_fatal", "gpu_ecc_uncorrectable"})
#: the scheduler's word on a node holds this long after its last report (its collector may stop)
SCHEDULER_STALE_S = 300.0
_STALLS = frozenset({"hung", "collective_wait"})
_PROGRESS = frozenset({"training", "slow_steps", "throttled"})
_STARTS = frozenset({"startup", "restart"})
_THROTTLE_FLAGS = (
    "gpu_throttle_hw_slowdown",
    "gpu_throttle_sw_thermal",
    "gpu_throttle_hw_thermal",
    "gpu_throttle_hw_power_brake",
)
#: slots kept for reuse, per GPU known (and at least _MIN_SLOTS): a GPU counts into one slot for
#: many frames, and moves among a few (its job's states); the combinations it ever had, over
#: jobs that come and go, are not needed
_SLOTS_PER_GPU = 4
_MIN_SLOTS = 4096


@dataclass(slots=True)
class GpuView:
    node: str
    gpu: str
    job: str = ""
    #: the team of the pod using or holding it (from pod metadata), when its job names none
    team: str = ""
    #: allocated to a pod, whether or not a process runs on it
    held: bool = False
    accounted: float = -math.inf  # counted up to here
    last_seen: float = -math.inf
    interval: float = 1.0
    throttled: bool = False
    clock_max: float = 0.0  # highest SM clock seen while it computed: its full speed
    state: str = ""
    cause: str = ""
    since: float = 0.0
    lost_fraction: float = 0.0


@dataclass(slots=True)
class Drain:
    node: str
    until: float
    reason: str
    by: str
    silence: str | None = None  # the silence muting the node's alerts meanwhile, when alerting runs


class ProductivityModel:
    """``finished_job_retention_s`` after a job ended or failed, its view (step-time baseline,
    heartbeats, clocks: about 1.5 KiB) is forgotten, counted in ``productivity_jobs_forgotten``;
    its GPU time stays in the ledger and the store, and the pages read its end from the events."""

    def __init__(
        self,
        price_per_gpu_hour: float = 2.5,
        *,
        finished_job_retention_s: float = FINISHED_JOB_RETENTION_S,
        counters: Counters | None = None,
    ) -> None:
        self.price = price_per_gpu_hour
        self.finished_job_retention_s = finished_job_retention_s
        self.counters = counters if counters is not None else Counters()
        self._swept_at = -math.inf
        self.ledger = Ledger()
        self.gpus: dict[tuple[str, str], GpuView] = {}
        self.jobs: dict[str, JobView] = {}
        self.services: set[str] = set()
        self.node_seen: dict[str, float] = {}
        self.fatal: set[tuple[str, str]] = set()
        self.drains: dict[str, Drain] = {}
        #: nodes the scheduler holds out of service, and when it last said so
        self.unavailable: dict[str, float] = {}
        self.holders = Holders()
        #: the slots counted into, reused: a GPU stays in one slot for many frames
        self._slots: dict[tuple[str, str, str, str, str, str], Slot] = {}
        self._lock = threading.Lock()

    # -- input ------------------------------------------------------------------------------------

    def observe(self, batch: Batch) -> None:
        with self._lock:
            for event in batch.events:
                job = event.labels.get("job")
                if job is not None:
                    self._job(job).on_event(event)
                elif event.kind == "agent_stopping":  # the node left on purpose: not down, gone
                    node = event.labels.get("node")
                    self.gpus = {k: v for k, v in self.gpus.items() if v.node != node}
            for record in batch.training:
                self._job(record.job).on_record(record)
            for frame in batch.frames:
                columns = positions(frame)
                if "gpu_utilization_percent" in columns:
                    self._gpu_frame(frame)
                elif (j := columns.get("slurm_node_unavailable")) is not None:
                    self._scheduler_frame(frame, frame.values[:, j])
                elif (j := columns.get("gpu_owner_allocated")) is not None:
                    self.holders.observe(frame, frame.values[:, j])
                elif frame.entities and "service" in frame.entities[0]:
                    self.services.update(e["service"] for e in frame.entities if "service" in e)

    def advance(self, now: float, firing: list[Alert]) -> None:
        """At evaluation time: take in fatal alerts, count silent GPUs as down, fold rollups."""
        with self._lock:
            self.fatal = {
                (a.entity.get("node", ""), a.entity.get("gpu", "")) for a in firing if a.rule in FATAL_RULES
            }
            for node in [n for n, d in self.drains.items() if d.until <= now]:
                del self.drains[node]
            for view in self.gpus.values():
                # every GPU every second, nearly all of them fresh: the cheapest test first
                silent = now - view.last_seen
                stale = STALE_INTERVALS * view.interval
                if silent <= STALE_MIN_S or silent <= stale or view.accounted >= now:
                    continue
                stale_after = max(STALE_MIN_S, stale)
                if view.node in self.drains:
                    cause = "drained"
                elif self._held_out(view.node, now):
                    cause = "draining"
                elif now - self.node_seen.get(view.node, -math.inf) > stale_after:
                    cause = "node_unreachable"
                else:
                    cause = "lost_gpu"
                self._count(view, view.accounted, now, cause, 0.0)
            self.ledger.fold(now)
            if now - self._swept_at >= JOB_SWEEP_S:
                self._swept_at = now
                self._forget_finished(now)

    def _forget_finished(self, now: float) -> None:
        """Drop the views of jobs over for longer than the retention that no GPU names any more."""
        named = {view.job for view in self.gpus.values()}
        cutoff = now - self.finished_job_retention_s
        gone = [n for n, j in self.jobs.items() if j.outcome and j.ended_at < cutoff and n not in named]
        for name in gone:
            del self.jobs[name]
        self.counters.inc("productivity_jobs_forgotten", len(gone))

    def load(self, store: Store, now: float) -> int:
        """At start: take in the GPU time the store kept (this hub's before it stopped, and that of
        other hubs sharing the store). Returns cells read."""
        cells = store.gpu_time(now - RETENTION_S, math.inf)
        with self._lock:
            self.ledger.load(cells)
        return len(cells)

    def save(self, store: Store, now: float | None = None) -> int:
        """Once a minute (and when the hub stops): write the minute cells changed since the last
        save; with ``now``, then let the store fold its minute cells into hours, a minute later
        than this ledger does, so that no cell is saved again after the store folded it. Returns
        cells written."""
        with self._lock:
            cells: list[GpuTime] = self.ledger.unsaved()
        if cells:
            try:
                store.save_gpu_time(cells)
            except StoreError:
                with self._lock:
                    self.ledger.not_saved(cells)  # kept for the next save
                raise
        if now is not None:
            store.fold_gpu_time(now - MINUTES_KEPT_S - MINUTE)
        return len(cells)

    def drain(self, node: str, until: float, reason: str, by: str = "") -> Drain:
        with self._lock:
            drain = self.drains[node] = Drain(node, until, reason, by)
            return drain

    def active_drains(self) -> list[Drain]:
        with self._lock:
            return sorted(self.drains.values(), key=lambda d: d.node)

    def undrain(self, node: str) -> Drain | None:
        with self._lock:
            return self.drains.pop(node, None)

    def _job(self, name: str) -> JobView:
        view = self.jobs.get(name)
        if view is None:
            view = self.jobs[name] = JobView(name)
        return view

    def _scheduler_frame(self, frame: Frame, held: FloatArray) -> None:
        for i, labels in enumerate(frame.entities):
            node = labels.get("node")
            value = float(held[i])
            if node is None or math.isnan(value):  # a partition's or a job's row
                continue
            if value > 0:
                self.unavailable[node] = max(self.unavailable.get(node, -math.inf), frame.ts)
            elif self.unavailable.get(node, math.inf) <= frame.ts:
                del self.unavailable[node]

    def _held_out(self, node: str, ts: float) -> bool:
        return 0.0 <= ts - self.unavailable.get(node, math.inf) <= SCHEDULER_STALE_S

    # -- classification ---------------------------------------------------------------------------

    def _gpu_frame(self, frame: Frame) -> None:
        ts = frame.ts
        columns = positions(frame)
        values = frame.values
        # the columns as Python floats once per frame: indexing numpy scalars row by row costs more
        util: list[float] = values[:, columns["gpu_utilization_percent"]].tolist()
        flags = [j for flag in _THROTTLE_FLAGS if (j := columns.get(flag)) is not None]
        is_throttled: list[bool] = (
            np.logical_or.reduce(values[:, flags] > 0, axis=1).tolist() if flags else [False] * len(util)
        )
        clock_at = columns.get("gpu_sm_clock_mhz")
        clocks: list[float] | None = None if clock_at is None else values[:, clock_at].tolist()
        holders = self.holders
        # no allocation reported (agents without the kubelet collector): no GPU is held, no pod has a team
        unheld = not holders.gpus and not holders.pod_team
        node_seen = self.node_seen
        last_node: str | None = None
        for i, labels in enumerate(frame.entities):
            node, gpu = labels.get("node"), labels.get("gpu")
            if node is None or gpu is None:
                continue
            if node != last_node:  # a frame's rows are one node's, as a rule: once is enough
                node_seen[node] = max(node_seen.get(node, -math.inf), ts)
                last_node = node
            key = (node, gpu)
            view = self.gpus.get(key)
            if view is None:
                view = self.gpus[key] = GpuView(node, gpu, accounted=ts, last_seen=ts)
                continue
            if ts <= view.accounted:
                continue
            if ts > view.last_seen:
                view.interval = 0.8 * view.interval + 0.2 * min(ts - view.last_seen, 60.0)
                view.last_seen = ts
            view.job = labels.get("job", "")
            if unheld:
                view.held = False
                view.team = labels.get("team") or ""
            else:
                view.held = holders.held(node, gpu, ts)
                view.team = labels.get("team") or holders.team(node, gpu, labels.get("pod", ""), ts)
            view.throttled = is_throttled[i]
            busy = util[i]
            job = self.jobs.get(view.job) if view.job else None
            if job is not None and clocks is not None:
                clock = clocks[i]
                if busy >= 50.0 and math.isfinite(clock) and clock > 0:
                    view.clock_max = max(view.clock_max, clock)
                else:
                    clock = view.clock_max  # idle or unknown: not slowed
                job.clocks[key] = (clock, view.clock_max)
            cause, lost = self._classify(view, busy, ts)
            if job is not None and cause != view.cause:
                self._recount(view, job, cause)
            self._count(view, view.accounted, ts, cause, lost)

    def _recount(self, view: GpuView, job: JobView, cause: str) -> None:
        """Move the seconds a change of state was learned late: a stall began at the job's last
        step and ended about one step before the next; a start-up ended when its first step began
        (known once that step is reported)."""
        if cause in _STALLS and view.cause in _PROGRESS:
            since = job.last_step_ts
        elif cause in _PROGRESS and view.cause in _STARTS:
            since = job.first_step_start
        elif cause in _PROGRESS and view.cause in _STALLS and math.isfinite(job.step_time):
            since = job.last_step_ts - job.step_time  # work resumed about one step before it was reported
        else:
            return
        self.ledger.move(since, view.accounted, self._slot(view, view.cause), self._slot(view, cause))

    def _classify(self, view: GpuView, util: float, ts: float) -> tuple[str, float]:
        key = (view.node, view.gpu)
        if view.node in self.drains:
            return "drained", 0.0
        if key in self.fatal and util < IDLE_UTIL:  # a GPU that computes again has been reset
            return "fatal_xid", 0.0
        # a draining node still runs its jobs to the end: only GPUs that compute nothing are lost
        if self._held_out(view.node, ts) and util < IDLE_UTIL:
            return "draining", 0.0
        if not view.job:
            if view.held:  # a pod holds it with no job known: idle is the idle-allocation waste
                return ("unattributed" if util >= IDLE_UTIL else "idle_job"), 0.0
            return ("unattributed" if util >= 50.0 else "no_job"), 0.0
        job = self.jobs.get(view.job)
        if view.job in self.services or job is None:
            return ("serving" if util >= IDLE_UTIL else "idle_job"), 0.0
        status = job.status(ts)
        if util < IDLE_UTIL:
            return ("dead_rank" if status == "collective_wait" else "idle_job"), 0.0
        if status != "running":
            return status, 0.0
        by_clock = job.clock_slowdown(ts)
        slowdown = max(job.slowdown(), by_clock)
        if slowdown > DEGRADED_AT:
            return ("throttled" if by_clock > DEGRADED_AT else "slow_steps"), 1.0 - 1.0 / slowdown
        return "training", 0.0

    def _slot(self, view: GpuView, cause: str) -> Slot:
        job = "" if view.job in self.services else view.job
        service = view.job if view.job in self.services else ""
        team = (self.jobs[job].team if job in self.jobs else "") or view.team or ("unassigned" if job else "")
        key = (view.node, view.gpu, job, team, service, cause)
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= max(_MIN_SLOTS, _SLOTS_PER_GPU * len(self.gpus)):  # start afresh
                self._slots.clear()
            slot = self._slots[key] = Slot(*key)
        return slot

    def _count(self, view: GpuView, start: float, end: float, cause: str, lost: float) -> None:
        if math.isfinite(start) and end > start:
            self.ledger.add(start, end, self._slot(view, cause), lost)
        view.accounted = end
        if cause != view.cause:
            view.since = start
        view.state, view.cause, view.lost_fraction = state_of(cause), cause, lost

    # -- output -----------------------------------------------------------------------------------

    def summary(self, by: str, start: float, end: float) -> dict[str, Any]:
        """GPU-hours and dollars per state and cause for each group over ``[start, end]``."""
        with self._lock:
            groups = self.ledger.summary(by, start, end, self.price)
        return {"by": by, "start": start, "end": end, "price_per_gpu_hour": self.price, "groups": groups}

    def waste_by_cause(self, start: float, end: float) -> list[dict[str, Any]]:
        """Wasted GPU-hours and dollars per cause over the fleet (degraded: the lost share), largest first."""
        rows = self.summary("fleet", start, end)["groups"]
        out = [
            {
                "cause": cause,
                "state": state,
                "owner": c["owner"],
                "gpu_hours": c["waste_gpu_hours"],
                "dollars": c["waste_dollars"],
            }
            for row in rows
            for state, s in row["states"].items()
            for cause, c in s["causes"].items()
            if c["waste_gpu_hours"] > 0
        ]
        return sorted(out, key=lambda r: -r["gpu_hours"])

    def gpu_hours(self, start: float, end: float) -> dict[str, float]:
        """Fleet GPU-hours per state over ``[start, end]``."""
        rows = self.summary("fleet", start, end)["groups"]
        return {state: row["gpu_hours"] for state, row in rows[0]["states"].items()} if rows else {}

    def gpu_states(self) -> list[dict[str, Any]]:
        """The state each GPU is in now, with its cause, owner and since when."""
        with self._lock:
            return [
                {
                    "node": v.node,
                    "gpu": v.gpu,
                    "job": v.job,
                    "state": v.state,
                    "cause": v.cause,
                    "owner": owner_of(v.cause) if v.cause else "",
                    "since": v.since,
                    "lost_fraction": round(v.lost_fraction, 3),
                    "stale": v.cause in ("lost_gpu", "node_unreachable"),
                }
                for v in sorted(
                    self.gpus.values(), key=lambda v: (v.node, int(v.gpu) if v.gpu.isdigit() else 0)
                )
                if v.state
            ]

    def job_status(self, job: str, now: float) -> str:
        """What the jobs list shows: running, stalled, degraded, failed or finished (or starting)."""
        with self._lock:
            view = self.jobs.get(job)
            if view is None:
                return "unknown"
            if view.outcome:
                return view.outcome
            causes = {g.cause for g in self.gpus.values() if g.job == job}
            if causes & {"hung", "collective_wait", "dead_rank", "idle_job"}:
                return "stalled"
            if causes & {"throttled", "slow_steps"}:
                return "degraded"
            return "running" if causes else "finished"
