"""The job got slower: ``step_time_regression``.

The job's step time (median of the ranks' ``step_seconds`` of each closed step) is judged two ways:
the median of the last minute (``recent_seconds``; at least ``min_recent`` and at most ``recent``
steps: 20 on a job that steps every second, 6 on a log sampled every 10 s) against the median of
the ``baseline`` steps before the last ``recent`` (at least ``ratio`` times higher), or a one-sided
CUSUM change-point test (small, sustained shifts) confirmed by the median of the last ``recent``
steps at least ``cusum_ratio`` higher. Either must hold for ``sustain`` seconds.
Checkpoint pauses are not steps and never enter; a rollback or restart starts a new baseline; when
the rolling baseline has caught up with a shift the CUSUM is re-seeded, so the new pace becomes normal.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import StepDetector, register
from gpuscope.detect.steps import StepView
from gpuscope.detect.vectors import Cusum
from gpuscope.model import Event, Finding

RULE = "step_time_regression"


@dataclass(slots=True)
class _Job:
    times: deque[tuple[float, float]] = field(default_factory=deque)  # (ts, step seconds)
    cusum: Cusum = field(default_factory=Cusum)
    since: float | None = None
    recent: float = math.nan
    base: float = math.nan


@register
class PaceDetector(StepDetector):
    rules = (RULE,)

    def __init__(
        self,
        recent: int = 20,
        recent_seconds: float = 60.0,
        min_recent: int = 6,
        baseline: int = 300,
        min_baseline: int = 50,
        ratio: float = 1.15,
        cusum_ratio: float = 1.04,
        sustain: float = 30.0,
    ) -> None:
        self.recent_n, self.baseline_n, self.min_baseline = recent, baseline, min_baseline
        self.recent_seconds, self.min_recent = recent_seconds, min_recent
        self.ratio, self.cusum_ratio, self.sustain = ratio, cusum_ratio, sustain
        super().__init__()
        self._jobs: dict[str, _Job] = {}
        self._touched: set[str] = set()

    def on_event(self, event: Event) -> None:
        if event.kind in ("job_started", "job_ended", "job_failed"):
            self._jobs.pop(event.labels.get("job", ""), None)

    def findings(self, now: float) -> list[Finding]:
        for name in self._touched:
            job = self._jobs.get(name)
            if job is not None:
                self._judge(job)
        self._touched.clear()
        out: list[Finding] = []
        for name, job in self._jobs.items():
            if job.since is not None and job.times and job.times[-1][0] - job.since >= self.sustain:
                out.append(self._finding(name, job))
        return out

    def step(self, view: StepView) -> None:
        self._touched.add(view.job)
        job = self._jobs.get(view.job)
        if job is None or view.rollback:
            job = self._jobs[view.job] = _Job()
        step = view.get("step_seconds")
        finite = step[np.isfinite(step) & (step > 0)]
        if not finite.size:
            return
        value = float(np.median(finite))
        job.times.append((view.ts, value))
        if len(job.times) > self.recent_n + self.baseline_n:
            job.times.popleft()
        cusum = job.cusum
        cusum.push(min(value, cusum.mean + 4.0 * cusum.spread) if cusum.warm else value)

    def _judge(self, job: _Job) -> None:
        values = np.fromiter((v for _, v in job.times), float, len(job.times))
        if len(values) < self.recent_n + self.min_baseline:
            job.since = None
            return
        job.base = float(np.median(values[: -self.recent_n]))
        job.recent = float(np.median(values[-self._recent(job) :]))
        # the last minute decides the ratio test; the CUSUM's small shifts are confirmed over the
        # last ``recent`` steps (the same on a job that steps every second)
        ratio = job.recent / job.base if job.base > 0 else math.nan
        steps = float(np.median(values[-self.recent_n :])) / job.base if job.base > 0 else math.nan
        shifted = job.cusum.alarm and steps >= self.cusum_ratio
        if job.cusum.alarm and not steps >= self.cusum_ratio:
            job.cusum = Cusum()  # the baseline caught up: the current pace is the new normal
        ts = job.times[-1][0]
        if ratio >= self.ratio or shifted:
            job.since = job.since if job.since is not None else ts
        elif not ratio >= 0.5 * (1.0 + self.cusum_ratio):
            job.since = None

    def _recent(self, job: _Job) -> int:
        """How many of the last steps are recent: those of the last ``recent_seconds``, between
        ``min_recent`` and ``recent`` of them (a job sampled every 10 s has 6 steps a minute)."""
        last, n = job.times[-1][0], 0
        for ts, _ in reversed(job.times):
            if n >= self.recent_n or last - ts >= self.recent_seconds:
                break
            n += 1
        return max(n, self.min_recent)

    def _finding(self, name: str, job: _Job) -> Finding:

        ratio = job.recent / job.base
        return Finding(
            RULE,
            {"job": name},
            f"Step time of job {name} rose to {job.recent:.3g} s from a baseline of {job.base:.3g} s "
            f"({ratio - 1:+.0%}) and stayed there",
            value=ratio,
            details={
                "recent_step_seconds": job.recent,
                "baseline_step_seconds": job.base,
                "cusum": job.cusum.s,
            },
        )
