"""A job that waits in the scheduler's queue far longer than its partition's usual wait:
``job_pending_too_long``.

Input: the ``slurm`` collector's rows, one per job (labels partition, job_id): pending jobs carry
``slurm_job_pending_seconds``, running ones ``slurm_job_queue_wait_seconds`` (the wait they had).
The baseline is per partition: the ``quantile`` of the waits of the last ``window`` jobs that
started there. A pending job fires once its wait exceeds ``factor`` times that baseline and
``floor`` seconds; a partition with fewer than ``min_started`` started jobs judges by ``cold_limit``
alone. Jobs that wait by their own choice (a dependency, a begin time, a user hold) are not judged.
The finding clears when the job starts, leaves the queue or stops being reported.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import Detector, register
from gpuscope.detect.frames import FrameView
from gpuscope.model import Finding, Frame, positions
from gpuscope.rules import JOB_PENDING_TOO_LONG

RULE = JOB_PENDING_TOO_LONG
#: pending reasons that are the job's own choice (Slurm's job_reason strings)
SELF_INFLICTED = frozenset({"Dependency", "BeginTime", "JobHeldUser", "JobArrayTaskLimit"})


@dataclass(slots=True)
class _Partition:
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    seen: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Pending:
    partition: str
    waited: float
    reason: str
    ts: float


@register
class QueueDetector(Detector):
    rules = (RULE,)

    def __init__(
        self,
        factor: float = 3.0,
        floor: float = 900.0,
        quantile: float = 0.9,
        min_started: int = 5,
        cold_limit: float = 6 * 3600.0,
        stale_after: float = 600.0,
    ) -> None:
        self.factor, self.floor, self.quantile = factor, floor, quantile
        self.min_started, self.cold_limit, self.stale_after = min_started, cold_limit, stale_after
        self._parts: dict[str, _Partition] = {}
        self._pending: dict[str, _Pending] = {}

    def reads(self, frame: FrameView) -> bool:
        metrics = frame.frame.metrics
        return "slurm_job_pending_seconds" in metrics or "slurm_job_queue_wait_seconds" in metrics

    def on_frame(self, frame: Frame) -> None:
        cols = positions(frame)
        pend, wait = cols.get("slurm_job_pending_seconds"), cols.get("slurm_job_queue_wait_seconds")
        if pend is None and wait is None:
            return
        for i, labels in enumerate(frame.entities):
            job, partition = labels.get("job_id"), labels.get("partition")
            if not job or partition is None:
                continue
            part = self._parts.setdefault(partition, _Partition())
            if wait is not None and math.isfinite(w := float(frame.values[i, wait])):
                self._pending.pop(job, None)
                if job not in part.seen:
                    part.seen.add(job)
                    part.waits.append(w)
                    if len(part.seen) > 4 * (part.waits.maxlen or 200):
                        part.seen = {job}
            elif pend is not None and math.isfinite(p := float(frame.values[i, pend])):
                self._pending[job] = _Pending(partition, p, labels.get("reason", ""), frame.ts)

    def limit(self, partition: str) -> float:
        """The wait beyond which a pending job of ``partition`` is judged too long."""
        part = self._parts.get(partition)
        if part is None or len(part.waits) < self.min_started:
            return self.cold_limit
        usual = float(np.quantile(np.fromiter(part.waits, float), self.quantile))
        return max(self.floor, self.factor * usual)

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for job, p in list(self._pending.items()):
            if now - p.ts > self.stale_after:
                del self._pending[job]  # no longer reported: it left the queue
                continue
            if p.reason in SELF_INFLICTED:
                continue
            limit = self.limit(p.partition)
            if p.waited > limit:
                out.append(
                    Finding(
                        RULE,
                        {"partition": p.partition, "job_id": job},
                        f"Job {job} has waited {p.waited / 3600:.1f} h in partition {p.partition} "
                        f"({p.reason or 'no reason given'}); its usual limit is {limit / 3600:.1f} h",
                        value=p.waited,
                        details={"reason": p.reason, "limit_seconds": limit, "waited_seconds": p.waited},
                    )
                )
        return out
