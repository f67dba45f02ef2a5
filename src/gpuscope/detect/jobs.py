"""Job lifecycle as detectors see it: which jobs run, where their ranks are, when they ended.

Job-level detectors must be quiet at job boundaries (a job that ended is not stalled, its ranks
are not lost), so each keeps one of these. A job is known from its ``job_started`` event, or
implicitly from its first training record or heartbeat when the hub started mid-job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.counters import Counters
from gpuscope.detect.refusals import refuse
from gpuscope.model import Event, Labels

RUNNING, ENDED, FAILED = "running", "ended", "failed"

#: where a rank runs: (node, gpu), the gpu "" for a rank without one (CPU-only training)
Place = tuple[str, str]


def place_labels(node: str, gpu: str) -> dict[str, str]:
    """An alert entity's node and gpu labels; no gpu label for a rank without a GPU."""
    return {"node": node, "gpu": gpu} if gpu else {"node": node}


def place_text(node: str, gpu: str) -> str:
    """``node-1 GPU 0``, or ``node-1 CPU`` for a rank without a GPU."""
    return f"{node} GPU {gpu}" if gpu else f"{node} CPU"


def gpu_of(value: Any) -> str:
    """A GPU label or placement entry; "" for none (a missing label, null)."""
    return "" if value is None else str(value)


LIFECYCLE_EVENTS = frozenset({"job_started", "job_ended", "job_failed"})


@dataclass(slots=True)
class Job:
    name: str
    kind: str  # "training" or "inference"
    state: str = RUNNING
    started_at: float | None = None
    ended_at: float | None = None
    declared_world_size: int = 0
    placement: dict[int, Place] = field(default_factory=dict)  # rank -> (node, gpu)
    reason: str | None = None
    presumed: bool = False  # ended because it went silent, not because anyone said so

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def world_size(self) -> int:
        known = max(self.placement) + 1 if self.placement else 0
        return max(self.declared_world_size, known, 1)

    def nodes(self) -> list[str]:
        """The job's nodes in rank order."""
        return list(dict.fromkeys(node for _, (node, _) in sorted(self.placement.items())))

    def place(self, rank: int, labels: Labels) -> Place | None:
        """Where ``rank`` runs: from the labels that came with its data, else from the placement."""
        node, gpu = labels.get("node"), gpu_of(labels.get("gpu"))
        if node is not None:
            if self.placement.get(rank) != (node, gpu):
                self.placement[rank] = (node, gpu)
            return node, gpu
        return self.placement.get(rank)


def parse_rank(value: Any) -> int | None:
    """A rank from an event label or record (int or decimal string), or None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdecimal():
        return int(value)
    return None


class JobTracker:
    """The jobs a detector has heard of, and their state."""

    def __init__(self, counters: Counters, keep_ended: int = 1000) -> None:
        self.jobs: dict[str, Job] = {}
        self._counters = counters
        self._keep_ended = keep_ended

    def on_event(self, event: Event) -> Job | None:
        """Apply a lifecycle event; returns the job it changed (None for other events)."""
        if event.kind not in LIFECYCLE_EVENTS:
            return None
        name = event.labels.get("job")
        if not name:
            self._bad(event, "labels.job is missing")
            return None
        if event.kind == "job_started":
            return self._start(name, event)
        job = self.jobs.get(name)
        if job is None:
            job = self.jobs[name] = Job(name, str(event.data.get("kind", "training")))
        if event.kind == "job_failed" and job.state == FAILED and job.ended_at is not None:
            # another rank's last words: the job ended when its first rank failed
            job.ended_at = min(job.ended_at, event.ts)
            return job
        job.state = ENDED if event.kind == "job_ended" else FAILED
        job.ended_at = event.ts
        if event.kind == "job_failed":
            job.reason = str(event.data.get("reason", "unknown"))
        self._trim()
        return job

    def close(self, name: str, ts: float, reason: str) -> Job | None:
        """End a job no event ended (it vanished); returns it, or None when unknown."""
        job = self.jobs.get(name)
        if job is not None and job.running:
            job.state, job.ended_at, job.reason, job.presumed = ENDED, ts, reason, True
            self._trim()
        return job

    def _start(self, name: str, event: Event) -> Job:
        data = event.data
        job = Job(name, str(data.get("kind", "training")), started_at=event.ts)
        world = data.get("world_size")
        if isinstance(world, int) and not isinstance(world, bool) and world > 0:
            job.declared_world_size = world
        elif world is not None:
            self._bad(event, f"data.world_size must be a positive integer, got {world!r}")
        placement = data.get("placement", [])
        if not isinstance(placement, list):
            self._bad(event, "data.placement must be a list of [rank, node, gpu]")
            placement = []
        for i, row in enumerate(placement):
            if not (isinstance(row, list | tuple) and len(row) == 3):
                self._bad(event, f"data.placement[{i}] must be [rank, node, gpu], got {row!r}")
                continue
            rank = parse_rank(row[0])
            if rank is None:
                self._bad(event, f"data.placement[{i}][0] must be a non-negative rank, got {row[0]!r}")
                continue
            job.placement[rank] = (str(row[1]), gpu_of(row[2]))
        self.jobs[name] = job
        return job

    def for_traffic(self, name: str, ts: float) -> Job | None:
        """The running training job that a record or heartbeat belongs to, created if unknown.

        Traffic for a job that ended is late (processes shutting down): it is counted, not obeyed,
        so it cannot resurrect the job; only a new ``job_started`` does. A job only presumed gone
        (it had fallen silent) that speaks again was alive after all, and is tracked anew.
        """
        job = self.jobs.get(name)
        if job is None or job.presumed:
            job = self.jobs[name] = Job(name, "training", started_at=ts)
            return job
        if not job.running:
            self._counters.inc("training_traffic_after_job_end")
            return None
        return job

    def _bad(self, event: Event, what: str) -> None:
        refuse(self._counters, "bad_job_events", "%s event at %s: %s", event.kind, event.ts, what)

    def _trim(self) -> None:
        ended = [name for name, job in self.jobs.items() if not job.running]
        for name in ended[: max(0, len(ended) - self._keep_ended)]:
            del self.jobs[name]


class StepsTold:
    """How far each job's heartbeats have told its step, and when (event time) that step was first
    told: whether a job still advances, for a detector that must not judge a stalled job.

    The training liveness detector feeds it (:meth:`beat`) with every well-formed heartbeat, and
    other detectors read it through the engine's shared feeds. A job keeps its furthest step across
    a restart (one that resumes below it advances again once it passes it). Bounded to ``max_jobs``:
    the job told least recently first is forgotten.
    """

    def __init__(self, max_jobs: int = 4096) -> None:
        self._told: dict[str, tuple[int, float]] = {}
        self.max_jobs = max_jobs

    def beat(self, job: str, step: object, ts: float) -> None:
        if type(step) is not int or step < 0:
            return
        told = self._told.get(job)
        if told is not None:
            if step <= told[0]:
                return
            del self._told[job]  # inserted again last: the jobs that stopped advancing go first
        elif len(self._told) >= self.max_jobs:
            del self._told[next(iter(self._told))]
        self._told[job] = (step, ts)

    def told(self, job: str) -> tuple[int, float] | None:
        """(the furthest step told, when it was first told), or None before any step."""
        return self._told.get(job)

    def forget(self, job: str) -> None:
        self._told.pop(job, None)
