"""Per-step views of a training job: the ranks' records of one step gathered into arrays.

Ranks report step ``k`` separately (and a live hub may get them over several requests), so a
step is *closed* once a later step has been seen, or once as many ranks as the job has ever
had reported it. Closed steps come out in order, with every rank's metrics side by side, which is
what cross-rank rules (skew, stragglers) and job-level rules (loss, step time) need. A step
lower than the last one (a restart from a checkpoint) is reported as a rollback so baselines
that would be misled by the repeated steps can start again. A rollback's steps are run again, so
they are newer than the step last closed; records of a lower step that are older than it came
late (an overloaded hub took a sender's retry after what followed it, or through another worker):
they are too late to be judged in order, and are counted as late (``dropped``) instead of
restarting every baseline of the job.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.jobs import Place, gpu_of, place_labels
from gpuscope.model import FloatArray, Labels, TrainingRecord


@dataclass(slots=True)
class StepView:
    """One closed step: ``ranks[i]`` reported ``values[name][i]`` (NaN when it did not report it)."""

    job: str
    step: int
    ts: float
    ranks: list[int]
    values: dict[str, FloatArray]
    rollback: bool = False
    nonfinite: frozenset[str] = frozenset()  # metrics some rank reported as NaN or infinity

    def get(self, name: str) -> FloatArray:
        column = self.values.get(name)
        return column if column is not None else np.full(len(self.ranks), math.nan)


@dataclass(slots=True)
class _Open:
    ts: float
    records: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(slots=True)
class _Job:
    open: dict[int, _Open] = field(default_factory=dict)
    last_closed: int = -1
    #: the time of the step last closed: a lower step from before it is late, not a rollback
    closed_ts: float = -math.inf
    world: int = 0
    placement: dict[int, Place] = field(default_factory=dict)
    heard: int = 0  # when its last record came, in records added


class StepGatherer:
    """Collects training records and yields closed steps per job, oldest first."""

    def __init__(self, max_open: int = 64, max_jobs: int = 4096) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.max_open = max_open
        #: jobs held at most: past it, those not heard from longest are forgotten (jobs end, and
        #: a hub runs for months); one that reports again starts afresh
        self.max_jobs = max_jobs
        self.jobs: dict[str, _Job] = {}
        self.dropped = 0  # records for steps already closed (too late to count)
        self.forgotten = 0  # jobs forgotten past max_jobs
        self._added = 0

    def add(self, record: TrainingRecord) -> None:
        self._added += 1
        job = self.jobs.get(record.job)
        if job is None:
            if len(self.jobs) >= self.max_jobs:
                self._forget()
            job = self.jobs[record.job] = _Job()
        job.heard = self._added
        node = record.labels.get("node")
        if node is not None:
            job.placement[record.rank] = (node, gpu_of(record.labels.get("gpu")))
        step = record.step
        if job.last_closed - 1 <= step <= job.last_closed or (
            step < job.last_closed and record.ts <= job.closed_ts
        ):
            self.dropped += 1
            return
        slot = job.open.get(step)
        if slot is None:
            slot = job.open[step] = _Open(record.ts)
        slot.ts = max(slot.ts, record.ts)
        slot.records[record.rank] = record.metrics
        if len(job.open) > self.max_open:
            del job.open[min(job.open)]
            self.dropped += 1

    def _forget(self) -> None:
        # a tenth of the bound at once, so that the scan runs once per many new jobs
        quiet = sorted(self.jobs, key=lambda name: self.jobs[name].heard)
        for name in quiet[: max(1, self.max_jobs // 10)]:
            del self.jobs[name]
            self.forgotten += 1

    def where(self, job: str, rank: int) -> Labels:
        """The node and GPU a rank runs on, as labels (empty when unknown)."""
        known = self.jobs.get(job)
        place = known.placement.get(rank) if known is not None else None
        return {} if place is None else place_labels(*place)

    def closed(self) -> Iterator[StepView]:
        """Every step that is complete now, per job in step order."""
        for name, job in self.jobs.items():
            if not job.open:
                continue
            newest = max(job.open)
            for step in sorted(job.open):
                slot = job.open[step]
                if step == newest and len(slot.records) < max(job.world, 1):
                    break
                del job.open[step]
                job.world = max(job.world, len(slot.records))
                rollback = step < job.last_closed - 1
                job.last_closed, job.closed_ts = step, slot.ts
                yield self._view(name, step, slot, rollback)

    @staticmethod
    def _view(job: str, step: int, slot: _Open, rollback: bool) -> StepView:
        ranks = sorted(slot.records)
        rows = [slot.records[r] for r in ranks]
        names = set(rows[0]).union(*rows[1:]) if len(rows) > 1 else set(rows[0])
        nan = math.nan
        values = {k: np.array([row.get(k, nan) for row in rows], float) for k in names}
        bad = frozenset(
            k for k, column in values.items() if not np.isfinite(column).all() and _reported(rows, k)
        )
        return StepView(job, step, slot.ts, ranks, values, rollback, bad)


def _reported(rows: list[dict[str, float]], key: str) -> bool:
    """Did some rank send ``key`` as NaN or infinity (rather than not send it)?"""
    return any(key in row and not math.isfinite(row[key]) for row in rows)
