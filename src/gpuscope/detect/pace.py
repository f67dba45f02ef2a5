"""The job got slower: ``step_time_regression``.

The job's step time (median of the ranks' ``step_seconds`` of each closed step) is judged two ways
against its baseline, the median of the steps of the ``baseline_seconds`` (5 minutes) before the
last ``recent`` steps (at least ``min_baseline``, at most ``baseline`` steps): the median of the
last minute (``recent_seconds``; at least ``min_recent`` and at most ``recent`` steps: 20 on a job
that steps every second, 6 on a log sampled every 10 s) at least ``ratio`` times it, or a
one-sided CUSUM change-point test (small, sustained shifts) confirmed by a *material* shift: the
median of the last ``recent`` steps at least the bar above the baseline. Either must hold for
``sustain`` seconds. Windows are in seconds so a job sampled every 10 s is judged on the same time
scales as one that steps every second.

The bar (for both tests) is the larger of two effect sizes:

* ``min_shift`` (8 %), the smallest slowdown worth a P2: the catalogue's small regressions start
  at 1.1x, a shift that small costs 7-9 % of the job's GPU time, and below it a job's own drift
  (data, other tenants, thermals) is of the same size (real per-worker logs drift by +3 to +5 %
  for many minutes). The CUSUM itself looks for a shift of that size: its allowance is half of it
  and it measures from the rolling baseline, so a smaller shift, or a drift slow enough for the
  baseline to follow, adds no evidence however long it lasts;
* ``noise_k`` (3) times the job's own wander: the spread (scaled MAD) of the medians of its past
  steps in blocks of ``recent``, over their median. A median of steps that wander together
  varies more than the spread of single steps says; on a quiet job the wander is far below
  ``min_shift``, on a job whose pace swings by several per cent from minute to minute the bar
  rises with it.

Checkpoint pauses are not steps and never enter; a rollback or restart starts a new baseline; a
shift that lasts becomes the baseline, and the CUSUM's evidence is capped so its alarm ends within a
few steps of that.

A held regression follows the fault rather than the baseline that learns it: it is measured from
the pace the job had when it began (the baseline then), and it holds while the job is still
materially slower than that pace (the bar of its start), however long the shift lasts; a further
material shift while it holds (the last minute the rule's stage bar, measured against the job's
wander as the condition began, above the pace the alert last told, for the bar's hold:
:attr:`gpuscope.rules.RuleSpec.stages`) is a new stage of worsening (:attr:`Finding.stage`), which
the alert layer tells again. A second cause inside an open alert is thus never silent, and the alert does not
resolve while the first cause has become the baseline.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import StepDetector, register
from gpuscope.detect.steps import StepView
from gpuscope.detect.vectors import Cusum
from gpuscope.detect.worsening import Worsening
from gpuscope.model import Event, Finding, FloatArray
from gpuscope.rules import STEP_TIME_REGRESSION as RULE
from gpuscope.rules import stages_of

STAGES = stages_of(RULE)


@dataclass(slots=True)
class _Job:
    cusum: Cusum
    #: the steps' times and step seconds, oldest first (two deques: numpy reads each at once)
    stamps: deque[float] = field(default_factory=deque)
    seconds: deque[float] = field(default_factory=deque)
    since: float | None = None
    recent: float = math.nan
    base: float = math.nan
    bar: float = math.nan  # the material shift, as a ratio to the baseline
    wander: float = 0.0  # how much the median of recent steps wanders, as a share (:meth:`_wander`)
    #: (recent, baseline) step seconds at the last judgement that held: what is said while the
    #: alert is held on its way down, and what a resolved alert keeps
    said: tuple[float, float] = (math.nan, math.nan)
    #: the baseline and material bar when the condition began: the pace before the alert
    before: tuple[float, float] = (math.nan, math.nan)
    #: the held condition's stages of worsening, measured in recent step seconds, and the growth
    #: that is one (the rule's stage bar for the job's wander as the condition began)
    worse: Worsening = field(default_factory=Worsening)
    stage_bar: float = math.nan


@register
class PaceDetector(StepDetector):
    rules = (RULE,)

    def __init__(
        self,
        recent: int = 20,
        recent_seconds: float = 60.0,
        min_recent: int = 6,
        baseline: int = 300,
        baseline_seconds: float = 300.0,
        min_baseline: int = 50,
        ratio: float = 1.15,
        min_shift: float = 0.08,
        noise_k: float = 3.0,
        sustain: float = 30.0,
    ) -> None:
        self.recent_n, self.baseline_n, self.min_baseline = recent, baseline, min_baseline
        self.recent_seconds, self.min_recent, self.baseline_seconds = (
            recent_seconds,
            min_recent,
            baseline_seconds,
        )
        self.ratio, self.min_shift, self.noise_k, self.sustain = ratio, min_shift, noise_k, sustain
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
            if job.since is not None and job.stamps and job.stamps[-1] - job.since >= self.sustain:
                out.append(self._finding(name, job))
        return out

    def step(self, view: StepView) -> None:
        self._touched.add(view.job)
        job = self._jobs.get(view.job)
        if job is None or view.rollback:
            job = self._jobs[view.job] = _Job(Cusum(min_shift=self.min_shift, cap=2.0))
        step = view.get("step_seconds")
        finite = step[np.isfinite(step) & (step > 0)]
        if not finite.size:
            return
        value = float(np.median(finite))
        job.stamps.append(view.ts)
        job.seconds.append(value)
        if len(job.stamps) > self.recent_n + self.baseline_n:
            job.stamps.popleft()
            job.seconds.popleft()
        cusum = job.cusum
        if not cusum.warm:
            cusum.push(value)
            return
        # measured from the rolling baseline once there is one: a drift slower than the baseline
        # follows adds nothing; one slow step (a data-loader hiccup) adds at most four spreads
        level = job.base if math.isfinite(job.base) else cusum.mean
        cusum.push(min(value, level + (cusum.allowance(level) + 4.0) * cusum.spread), level)

    def _judge(self, job: _Job) -> None:
        values = np.fromiter(job.seconds, float, len(job.seconds))
        if len(values) < self.recent_n + self.min_baseline:
            job.since = None
            return
        stamps = np.fromiter(job.stamps, float, len(job.stamps))[: -self.recent_n]
        # the steps of the ``baseline_seconds`` before the recent ones, within the bounds
        n = len(stamps) - int(np.searchsorted(stamps, stamps[-1] - self.baseline_seconds, side="right"))
        baseline = values[-self.recent_n - min(max(n, self.min_baseline), self.baseline_n) : -self.recent_n]
        job.base = float(np.median(baseline))
        job.recent = float(np.median(values[-self._recent(job) :]))
        # the last minute decides the ratio test; the CUSUM's small shifts are confirmed over the
        # last ``recent`` steps (the same on a job that steps every second)
        ratio = job.recent / job.base if job.base > 0 else math.nan
        steps = float(np.median(values[-self.recent_n :])) / job.base if job.base > 0 else math.nan
        job.wander = self._wander(values[: -self.recent_n])
        job.bar = 1.0 + max(self.min_shift, self.noise_k * job.wander)
        shifted = job.cusum.alarm and steps >= job.bar
        ts = job.stamps[-1]
        if ratio >= max(self.ratio, job.bar) or shifted:
            if job.since is None:
                job.since, job.before, job.worse = ts, (job.base, job.bar), Worsening()
                job.stage_bar = STAGES.bar(job.wander)
            self._follow(job, job.base * max(ratio, steps if shifted else ratio), ts)
        elif job.since is not None and job.recent >= job.before[0] * job.before[1]:
            self._follow(job, job.recent, ts)  # the baseline learnt the fault; the job did not recover
        elif not ratio >= 1.0 + 0.5 * self.min_shift:
            job.since = None

    def _follow(self, job: _Job, recent: float, ts: float) -> None:
        """The held condition at ``recent`` step seconds: said against the pace before it began,
        and a new stage once it stays the material bar above what the alert last told."""
        job.said = (recent, job.before[0])
        if job.since is not None and ts - job.since >= self.sustain:  # told from here on
            job.worse.follow(recent, ts, job.stage_bar, STAGES.hold)

    def _wander(self, past: FloatArray) -> float:
        """How much the median of ``recent`` steps wanders on this job: the scaled MAD of the
        medians of the past steps' last whole blocks of ``recent``, as a share of their median
        (a slow drift is wander too; a median of steps that wander together varies more than the
        spread of single steps says)."""
        n = self.recent_n
        blocks = len(past) // n
        if blocks < 2:
            return 0.0
        # sorted rows rather than ``np.median``: the same values, at a fraction of its per-call cost
        medians = _middle(np.sort(past[len(past) - blocks * n :].reshape(blocks, n), axis=1))
        middle = float(_middle(np.sort(medians)))
        return 1.4826 * float(_middle(np.sort(np.abs(medians - middle)))) / middle if middle > 0 else 0.0

    def _recent(self, job: _Job) -> int:
        """How many of the last steps are recent: those of the last ``recent_seconds``, between
        ``min_recent`` and ``recent`` of them (a job sampled every 10 s has 6 steps a minute)."""
        last, n = job.stamps[-1], 0
        for ts in reversed(job.stamps):
            if n >= self.recent_n or last - ts >= self.recent_seconds:
                break
            n += 1
        return max(n, self.min_recent)

    def _finding(self, name: str, job: _Job) -> Finding:
        recent, base = job.said
        ratio = recent / base
        stage = job.worse.stage
        again = f"; it grew materially worse {stage} time(s) while its alert was open" if stage else ""
        return Finding(
            RULE,
            {"job": name},
            f"Step time of job {name} rose to {recent:.3g} s from a baseline of {base:.3g} s "
            f"({ratio - 1:+.0%}) and stayed there{again}",
            value=ratio,
            details={
                "recent_step_seconds": recent,
                "baseline_step_seconds": base,
                "cusum": job.cusum.s,
                "material_ratio": job.before[1],
            },
            stage=stage,
        )


def _middle(rows: FloatArray) -> FloatArray:
    """The median of each sorted row (of the sorted array, for one row), as ``np.median`` gives it."""
    n = rows.shape[-1]
    mid = rows[..., n // 2]
    return mid if n % 2 else 0.5 * (rows[..., n // 2 - 1] + mid)
