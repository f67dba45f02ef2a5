"""What the loss and the gradient say: ``loss_nan``, ``loss_spike``, ``loss_divergence``,
``loss_plateau`` and ``grad_norm_explosion``.

Each closed step gives the job's loss (mean of the ranks' finite losses) and gradient norm (median
over ranks, so one skewed rank is :mod:`~gpuscope.detect.ranks`' business, not an explosion).

* NaN/Inf loss on any rank fires ``loss_nan`` at once; non-finite values never enter a baseline.
* A spike is a step ``spike_ratio`` above the rolling median of recent steps (or ``mild_ratio``
  on two steps in a row), and far outside its MAD-scaled spread; the gradient the same way.
* Divergence: the smoothed loss (time EWMA) rose ``divergence`` above the best it reached and is
  still rising, for ``sustain`` seconds. Each step weighs in the EWMA for the time since the last
  step seen, up to ``HOLE`` times the job's usual gap (the median of its last 16) or an eighth of
  ``smooth_tau``, whichever is longer: after a hole in what reached the hub (a shedding hub's
  refusals, a spool that overflowed) the one step that follows stood for the whole hole, up to
  63 % of the smoothed loss, and one noisy step became the best or a divergence; now it moves the
  smoothed loss by 12 % of its excess at most (a job whose steps are minutes long by a step's
  worth, as before). The smoothing has settled, and the best is kept, once it has weighed
  ``smooth_tau`` seconds of steps. Where steps are missing from the smoothing's window (its
  coverage: the share of the last ``smooth_tau`` its steps stand for), the smoothed loss is a mean
  of an unevenly sampled curve and may be off by up to the share missing times how far the steps
  stray from it (:meth:`_Job.doubt`); the rise must exceed ``divergence`` plus ``DOUBT_Z`` times
  that doubt, of the best's window and of now. On time the doubt is nil.
  Plateau: over the last ``plateau_window`` seconds the smoothed loss improved by less than
  ``plateau_gain`` and by far less than in each of the two windows before. A shorter test judges
  any job from three ``plateau_short`` windows of age: the loss was falling by many times its own
  noise over the two windows before and is flat, within that noise, over the last one
  (:meth:`LossDetector._short_plateau`). A young job, in its first minutes of training, is judged
  by a third test: its loss fell from its start and stopped dead, flat within its noise for four
  minutes (:meth:`LossDetector._young_plateau`).
  Every baseline restarts after a rollback to an earlier step or a job restart, but the young
  test's curve: it is kept up to the step the job resumes from.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.base import StepDetector, register
from gpuscope.detect.baseline import RollingMedian
from gpuscope.detect.settings import FINISHED_JOB_RETENTION_S, JOB_SWEEP_S
from gpuscope.detect.steps import StepView
from gpuscope.model import Event, Finding

#: a gap between reported steps this many times the job's usual one is a hole in the data
HOLE = 3.0
#: how many mean absolute deviations of the steps' loss the doubt of a partly covered window
#: stands for (see ``_Job.doubt``)
DOUBT_Z = 1.0
#: the short plateau test: the pace before must be this many noise units; the gain over the last
#: window below this many (and below ``FLAT_SHARE`` of the pace before)
FALL_Z, FLAT_Z, FLAT_SHARE = 8.0, 2.0, 0.3
#: half-window blocks kept for the noise estimate, the sub-blocks of each, and the fewest second
#: differences of sub-block means the estimate needs
NOISE_BLOCKS, SUBS, NOISE_MIN = 20, 5, 6
#: the young-job test: sub-blocks of ``plateau_short`` / ``YOUNG_SUB`` seconds; the flat window is
#: ``YOUNG_FLAT`` of them and starts within the job's first ``YOUNG_SPAN`` (later onsets are the
#: short test's); its gain must stay under ``YOUNG_SHARE`` of the drop to it: a pure exponential
#: decay leaves more than that unless its time constant is under about 40 s (see the docstring)
YOUNG_SUB, YOUNG_FLAT, YOUNG_SPAN, YOUNG_SHARE = 10, 8, 20, 0.1
#: and the loss must have fallen by this share of its level since the job's first sub-block: what
#: the first minutes of training shed (a resumed job's start transient is a few percent)
YOUNG_FELL = 0.1

NAN_RULE, SPIKE, DIVERGE, PLATEAU, GRAD = (
    "loss_nan",
    "loss_spike",
    "loss_divergence",
    "loss_plateau",
    "grad_norm_explosion",
)


@dataclass(slots=True)
class _Spiky:
    """A rolling median baseline and the spike verdict of the latest steps."""

    base: RollingMedian = field(default_factory=lambda: RollingMedian(31))
    mild: int = 0
    last_hit: float = -math.inf
    value: float = math.nan
    ratio: float = math.nan
    median: float = math.nan

    def judge(self, value: float, ts: float, strong: float, mild: float, mild_steps: int, warm: int) -> None:
        if not math.isfinite(value):
            return
        base = self.base
        if len(base) >= warm:
            median = base.median()
            spread = max(1.4826 * base.mad(), 0.01 * abs(median), 1e-12)
            ratio = value / median if median > 0 else math.nan
            far = (value - median) / spread >= 6.0
            self.mild = self.mild + 1 if far and ratio >= mild else 0
            if far and (ratio >= strong or self.mild >= mild_steps):
                self.last_hit, self.value, self.ratio, self.median = ts, value, ratio, median
        base.push(value)


@dataclass(slots=True)
class _Job:
    loss: _Spiky = field(default_factory=_Spiky)
    grad: _Spiky = field(default_factory=_Spiky)
    nan_at: float = -math.inf
    nan_step: int = -1  # the first NaN step of the episode the alert is about
    nan_last: int = -1
    smooth: float = math.nan
    smooth_ts: float = math.nan
    #: the last gaps between the steps it reported, and seconds of steps the smoothing has weighed
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    weighed: float = 0.0
    #: the share of the last ``smooth_tau`` its steps cover (exponentially weighted), how far a
    #: step's loss strays from the smoothed one (relative, mean absolute), and the doubt the best
    #: was taken with
    coverage: float = 1.0
    spread: float = 0.0
    best_doubt: float = 0.0

    def doubt(self) -> float:
        """How far off the smoothed loss may be for the steps missing from its window: the share
        missing times how far the steps stray (a curve sampled unevenly: a hole of its low or its
        high steps moves the mean of the rest by up to that)."""
        return (1.0 - self.coverage) * self.spread

    start_ts: float = math.nan
    best: float = math.inf
    rising_since: float | None = None
    history: deque[tuple[float, float]] = field(default_factory=deque)  # (ts, smoothed) every minute
    plateau_checks: int = 0
    #: the open half-window block of the short test (its end, sum, steps), the closed ones
    #: (mean, steps), its consecutive flat verdicts, whether it is on and what it measured
    blk_end: float = math.nan
    blk_sum: list[float] = field(default_factory=lambda: [0.0] * SUBS)
    blk_n: list[int] = field(default_factory=lambda: [0] * SUBS)
    blocks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=NOISE_BLOCKS))
    #: |second differences| of the sub-block means inside each closed block (the noise estimate)
    wiggles: deque[float] = field(default_factory=lambda: deque(maxlen=NOISE_BLOCKS * (SUBS - 2)))
    short_checks: int = 0
    short_on: bool = False
    short_seen: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # gain, pace, noise
    #: the young test's closed sub-blocks (mean, steps, last step), how many since the job's first
    #: step, the open one (its end, sum, steps, last step), the first step seen, its verdict and
    #: what it measured (gain, drop, noise)
    young: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=YOUNG_SPAN + YOUNG_FLAT + 2)
    )
    young_count: int = 0
    yb_end: float = math.nan
    yb_sum: float = 0.0
    yb_n: int = 0
    yb_last: int = -1
    young_first: int = -1
    young_on: bool = False
    young_seen: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    step: int = -1
    ended_at: float = math.nan  # when it ended or failed (NaN while it runs)

    def restart(self) -> None:
        self.loss, self.grad = _Spiky(), _Spiky()  # a restart resumes from an older step: new baselines
        self.smooth = self.smooth_ts = self.start_ts = math.nan
        self.gaps.clear()
        self.weighed, self.coverage, self.spread, self.best_doubt = 0.0, 1.0, 0.0, 0.0
        self.best = math.inf
        self.rising_since = None
        self.history.clear()
        self.plateau_checks = 0
        self.blk_end, self.blk_sum, self.blk_n = math.nan, [0.0] * SUBS, [0] * SUBS
        self.blocks.clear()
        self.wiggles.clear()
        self.short_checks, self.short_on = 0, False


@register
class LossDetector(StepDetector):
    rules = (NAN_RULE, SPIKE, DIVERGE, PLATEAU, GRAD)

    def __init__(
        self,
        spike_ratio: float = 1.3,
        mild_ratio: float = 1.08,
        grad_ratio: float = 3.0,
        grad_mild: float = 1.5,
        warm_steps: int = 5,
        hold: float = 30.0,
        smooth_tau: float = 120.0,
        divergence: float = 0.025,
        sustain: float = 60.0,
        plateau_window: float = 900.0,
        plateau_gain: float = 0.0015,
        plateau_short: float = 300.0,
        finished_job_retention_s: float = FINISHED_JOB_RETENTION_S,
    ) -> None:
        self.spike_ratio, self.mild_ratio = spike_ratio, mild_ratio
        self.grad_ratio, self.grad_mild = grad_ratio, grad_mild
        self.warm_steps, self.hold, self.smooth_tau = warm_steps, hold, smooth_tau
        self.divergence, self.sustain = divergence, sustain
        self.plateau_window, self.plateau_gain = plateau_window, plateau_gain
        self.plateau_short = plateau_short
        #: a job over for this long is forgotten (counted in ``loss_jobs_forgotten``)
        self.finished_job_retention_s = finished_job_retention_s
        self.counters = Counters()
        super().__init__()
        self._jobs: dict[str, _Job] = {}
        self._swept_at = -math.inf

    def on_event(self, event: Event) -> None:
        if event.kind in ("job_started", "job_ended", "job_failed"):
            name = event.labels.get("job")
            job = self._jobs.get(name or "")
            if job is not None:
                job.restart()
                job.young_on = False
                job.ended_at = math.nan if event.kind == "job_started" else event.ts

    def keep_finished_jobs(self, seconds: float) -> None:
        self.finished_job_retention_s = seconds

    def findings(self, now: float) -> list[Finding]:
        if now - self._swept_at >= JOB_SWEEP_S:
            self._swept_at = now
            cutoff = now - max(self.finished_job_retention_s, self.hold)
            gone = [name for name, job in self._jobs.items() if job.ended_at < cutoff]
            for name in gone:
                del self._jobs[name]
            self.counters.inc("loss_jobs_forgotten", len(gone))
        out: list[Finding] = []
        for name, job in self._jobs.items():
            out.extend(self._findings(name, job, now))
        return out

    def step(self, view: StepView) -> None:
        job = self._jobs.get(view.job)
        if job is None:
            job = self._jobs[view.job] = _Job()
        if view.rollback:
            job.restart()
            self.counters.inc("loss_baselines_restarted_rollback")
        job.step = view.step
        losses = view.get("loss")
        if "loss" in view.nonfinite:
            if view.ts - job.nan_at >= self.hold or view.step < job.nan_step:  # a new episode
                job.nan_step = view.step
            job.nan_at, job.nan_last = view.ts, view.step
        finite = losses[np.isfinite(losses)]
        loss = float(finite.mean()) if finite.size else math.nan
        grads = view.get("grad_norm")
        finite_g = grads[np.isfinite(grads)]
        grad = float(np.median(finite_g)) if finite_g.size else math.nan
        job.loss.judge(loss, view.ts, self.spike_ratio, self.mild_ratio, 2, self.warm_steps)
        job.grad.judge(grad, view.ts, self.grad_ratio, self.grad_mild, 3, self.warm_steps)
        if math.isfinite(loss):
            self._young(job, view.ts, view.step, loss)
            self._trend(job, view.ts, loss)

    def _trend(self, job: _Job, ts: float, loss: float) -> None:
        self._block(job, ts, loss)
        if not math.isfinite(job.smooth):
            job.smooth, job.smooth_ts, job.start_ts = loss, ts, ts
            return
        gap = max(ts - job.smooth_ts, 0.0)
        job.gaps.append(gap)
        # the job's own step: the steps missing in a hole do not weigh on the one after it
        usual = HOLE * float(np.median(job.gaps))
        dt = min(gap, max(usual, self.smooth_tau / 8.0), self.smooth_tau)
        gain = 1.0 - math.exp(-dt / self.smooth_tau)
        if job.smooth > 0:
            job.spread += gain * (abs(loss / job.smooth - 1.0) - job.spread)
        job.smooth += gain * (loss - job.smooth)
        job.smooth_ts = ts
        job.weighed += dt
        if gap > 0:
            fade = math.exp(-gap / self.smooth_tau)
            job.coverage = fade * job.coverage + (1.0 - fade) * min(usual / gap, 1.0)
        if job.weighed < self.smooth_tau:
            return  # the smoothing has not settled yet
        if job.smooth < job.best:
            job.best, job.best_doubt = job.smooth, job.doubt()
        if not job.history or ts - job.history[-1][0] >= 60.0:
            job.history.append((ts, job.smooth))
            while job.history and ts - job.history[0][0] > 3.2 * self.plateau_window:
                job.history.popleft()
            self._plateau(job, ts)
        past = [s for t, s in job.history if ts - t >= self.smooth_tau]
        rising = bool(past) and job.smooth > past[-1]
        # beyond what the steps missing from the window of the best and of now may account for
        doubt = DOUBT_Z * (job.best_doubt + job.doubt())
        if job.smooth >= job.best * (1.0 + self.divergence + doubt) and rising:
            job.rising_since = job.rising_since if job.rising_since is not None else ts
        elif job.smooth < job.best * (1.0 + 0.5 * self.divergence):
            job.rising_since = None

    def _plateau(self, job: _Job, ts: float) -> None:
        """Flat now, after clearly improving before: the gain over the last window is below
        ``plateau_gain`` and well below the pace the curve was on over the two windows before.
        That pace is the slowest of their four half-windows: a learning-rate drop is a step of a
        few dozen steps, so it lifts one half-window, or two where it straddles their boundary,
        and is not the pace the curve was on (a healthy curve flattens slowly after it)."""
        hist, w = job.history, self.plateau_window
        if ts - job.start_ts < 3 * w or hist[-1][0] - hist[0][0] < 2.9 * w:
            job.plateau_checks = 0
            return
        points = [self._at(hist, ts - k * w / 2) for k in (6, 5, 4, 3, 2)]
        prev = 2.0 * min((x - y) / abs(x) for x, y in itertools.pairwise(points))
        b, c = points[-1], self._at(hist, ts)
        gain = (b - c) / abs(b)
        was_improving = prev >= 4.0 * self.plateau_gain  # a curve that was already flat is not news
        flat = (
            was_improving
            and gain < self.plateau_gain
            and gain < 0.3 * prev
            and c <= b * (1 + self.divergence)
        )
        job.plateau_checks = job.plateau_checks + 1 if flat else 0

    def _block(self, job: _Job, ts: float, loss: float) -> None:
        """Adds a step's loss to its sub-block of the open half-window block; each block closed is
        judged."""
        half = self.plateau_short / 2.0
        if not math.isfinite(job.blk_end):
            job.blk_end = ts + half
        while ts >= job.blk_end:
            n = sum(job.blk_n)
            job.blocks.append((sum(job.blk_sum) / n if n else math.nan, n))
            subs = [t / c for t, c in zip(job.blk_sum, job.blk_n, strict=True) if c]
            wiggles = zip(subs, subs[1:], subs[2:], strict=False)
            job.wiggles.extend(abs(a - 2.0 * b + c) for a, b, c in wiggles)
            job.blk_sum, job.blk_n = [0.0] * SUBS, [0] * SUBS
            job.blk_end += half
            self._short_plateau(job)
        sub = min(int((ts - job.blk_end + half) / half * SUBS), SUBS - 1)
        job.blk_sum[sub] += loss
        job.blk_n[sub] += 1

    def _short_plateau(self, job: _Job) -> None:
        """Flat over the last ``plateau_short`` window, after falling by many times the curve's own
        noise over the two windows before. Six half-window blocks: each pair of neighbours gives a
        pace (twice the fall of the mean from one to the next, a window's worth); the pace before is
        the slowest of the first three pairs (a learning-rate drop, or the recovery after a spike,
        lifts one or two of them, not the pace the curve was on), the gain is the last pair's.
        The noise unit is the spread such a pace would have from noise alone, measured on the curve:
        the scatter of the second differences of the sub-block means inside each block (a local
        linear trend removed; the median, so a learning-rate drop or the onset's kink is an outlier
        among up to ``NOISE_BLOCKS`` blocks' worth). Sub-block means, not single steps: noise
        correlated over a few dozen steps weighs as it does on a block's mean. A curve falling by
        ``FALL_Z`` noise units that gains less than ``FLAT_Z`` of them, and less than
        ``FLAT_SHARE`` of its pace, has stopped once the next block confirms it flat, and stays so
        while flat. Late in a long healthy run a window's gain is a few noise units: not judged."""
        blocks = job.blocks
        if len(blocks) < 6:
            return
        counts = sorted(n for _, n in blocks)
        enough = max(3, counts[len(counts) // 2] // 2)
        last = list(itertools.islice(blocks, len(blocks) - 6, None))
        if any(n < enough for _, n in last):
            job.short_checks, job.short_on = 0, False
            return
        means = [m for m, _ in last]
        paces = [2.0 * (a - b) for a, b in itertools.pairwise(means)]
        pace, gain = min(paces[:3]), paces[-1]
        if len(job.wiggles) < NOISE_MIN:
            return
        # a sub-block mean's deviation is 1.4826 * median / sqrt(6) (a second difference weighs
        # three of them); a block mean's is that over sqrt(SUBS), a pace's 2 * sqrt(2) of those
        noise = 2.0 * math.sqrt(2.0 / 6.0 / SUBS) * 1.4826 * float(np.median(job.wiggles))
        noise = max(noise, 1e-9 * abs(means[-1]))
        flat = gain < FLAT_Z * noise and means[-1] <= means[-2] * (1.0 + self.divergence)
        if job.short_on or job.short_checks:
            # confirmed while it stays flat (the onset's block now weighs in the pace before, so
            # the pace shown stays the one judged)
            job.short_on, job.short_checks = flat, 0
            job.short_seen = (gain, job.short_seen[1], noise)
            return
        judged = flat and pace >= FALL_Z * noise and gain < FLAT_SHARE * pace
        job.short_checks = 1 if judged else 0
        job.short_seen = (gain, pace, noise)

    def _young(self, job: _Job, ts: float, step: int, loss: float) -> None:
        """Adds a step's loss to the young test's open sub-block; each sub-block closed is judged.
        A step at or below one already counted is a restart from a checkpoint: the curve up to it
        still stands (the loss resumes from the checkpoint's), the sub-blocks after it are dropped."""
        if job.young_first < 0:
            job.young_first = step
        last = job.yb_last if job.yb_n else (job.young[-1][2] if job.young else -1)
        if step <= last:
            while job.young and job.young[-1][2] >= step:
                job.young.pop()
                job.young_count -= 1
            job.yb_end, job.yb_sum, job.yb_n, job.young_on = math.nan, 0.0, 0, False
        sub = self.plateau_short / YOUNG_SUB
        if not math.isfinite(job.yb_end):
            job.yb_end = ts + sub
        if ts >= job.yb_end:
            counts = sorted(n for _, n, _ in job.young)
            enough = max(3, counts[len(counts) // 2] // 2 if counts else 0)
            # a thin sub-block (a checkpoint pause, a hole in the data) is left out, not judged
            if job.yb_n >= enough:
                job.young.append((job.yb_sum / job.yb_n, job.yb_n, job.yb_last))
                job.young_count += 1
                self._young_plateau(job)
            job.yb_sum, job.yb_n = 0.0, 0
            job.yb_end += sub * math.floor((ts - job.yb_end) / sub + 1.0)
        job.yb_sum += loss
        job.yb_n += 1
        job.yb_last = step

    def _young_plateau(self, job: _Job) -> None:
        """A young job whose loss fell from its start and then stopped dead: flat, within its noise,
        over the last ``YOUNG_FLAT`` sub-blocks, well below every sub-block before them (the one
        just before may hold the onset and is left out), and gaining under ``YOUNG_SHARE`` of that
        drop. A young curve that decelerates naturally keeps gaining: a power law
        ``(1 + t/t0)^-a`` gains over the window at least a quarter of the drop to it, a pure
        exponential ``exp(-t/tau)`` more than a tenth while ``tau`` is over about 40 s (a curve that
        has finished falling within two minutes and then stays flat for four has stopped
        improving). The noise unit is the scatter of the second differences of the window's
        sub-block means (a healthy curve's bend only makes it larger; the start's steep bend is left
        out). Judged only for a job that started training (its first step no more than its first
        sub-block's steps, and its loss fell by ``YOUNG_FELL`` of its level since: a job resumed
        late in its curve starts low and flat, and its start transient is a few percent), with the
        window's start in its first ``YOUNG_SPAN`` sub-blocks; on, it stays until the last
        ``YOUNG_FLAT`` gain twice the bar they were judged flat by."""
        subs, k = job.young, YOUNG_FLAT
        if len(subs) < k + 2:
            return
        means = [m for m, _, _ in subs]
        window = means[-k:]
        seconds = [abs(a - 2.0 * b + c) for a, b, c in zip(window, window[1:], window[2:], strict=False)]
        # a sub-block mean's deviation (a second difference weighs three of them)
        noise = max(1.4826 * float(np.median(seconds)) / math.sqrt(6.0), 1e-9 * abs(means[-1]))
        if job.young_on:  # the bar it was judged against, unless the noise grew (six values)
            noise = max(noise, job.young_seen[2])
        first, second = float(np.mean(window[: k // 2])), float(np.mean(window[k // 2 :]))
        gain = first - second
        # once on, it lets go when the loss improves again by twice the bar it was judged flat by
        bar = FLAT_Z * noise * math.sqrt(4.0 / k) * (2.0 if job.young_on else 1.0)
        flat = gain < bar and second <= first * (1.0 + self.divergence)
        if job.young_on:
            job.young_on = flat
            job.young_seen = (gain, job.young_seen[1], noise)
            return
        fresh = job.young_first <= subs[0][1]
        if not fresh or job.young_count - k > YOUNG_SPAN:
            return
        level = float(np.mean(window))
        drop = min(means[: -k - 1]) - level
        job.young_on = (
            flat
            and drop >= FALL_Z * noise * math.sqrt(1.0 + 1.0 / k)
            and gain < YOUNG_SHARE * drop
            and means[0] - level >= YOUNG_FELL * abs(level)
        )
        job.young_seen = (gain, drop, noise)

    @staticmethod
    def _at(hist: deque[tuple[float, float]], ts: float) -> float:
        """Median of the three smoothed samples nearest ``ts``."""
        near = sorted(hist, key=lambda p: abs(p[0] - ts))[:3]
        return float(np.median([v for _, v in near]))

    def _findings(self, name: str, job: _Job, now: float) -> list[Finding]:
        out: list[Finding] = []
        entity = {"job": name}
        if now - job.nan_at < self.hold:
            out.append(
                Finding(
                    NAN_RULE,
                    entity,
                    f"Loss of job {name} is NaN/Inf from step {job.nan_step}"
                    + (f" (still at step {job.nan_last})" if job.nan_last > job.nan_step else ""),
                    details={"step": job.nan_step, "last_step": job.nan_last},
                )
            )
        for rule, spiky, what in ((SPIKE, job.loss, "Loss"), (GRAD, job.grad, "Gradient norm")):
            if now - spiky.last_hit < self.hold:
                out.append(
                    Finding(
                        rule,
                        entity,
                        f"{what} of job {name} jumped to {spiky.value:.4g}, {spiky.ratio:.1f}x its rolling "
                        f"median "
                        f"({spiky.median:.4g})",
                        value=spiky.ratio,
                        details={"value": spiky.value, "baseline_median": spiky.median, "ratio": spiky.ratio},
                    )
                )
        if job.rising_since is not None and job.smooth_ts - job.rising_since >= self.sustain:
            rise = job.smooth / job.best - 1.0
            out.append(
                Finding(
                    DIVERGE,
                    entity,
                    f"Loss of job {name} has been rising for {job.smooth_ts - job.rising_since:.0f} s: "
                    f"{job.smooth:.4g} smoothed, {rise:.1%} above its best ({job.best:.4g})",
                    value=rise,
                    details={"smoothed_loss": job.smooth, "best_loss": job.best},
                )
            )
        if job.young_on and not job.short_on:
            gain, drop, noise = job.young_seen
            ref = abs(job.smooth) or 1.0
            window = YOUNG_FLAT * self.plateau_short / YOUNG_SUB
            out.append(
                Finding(
                    PLATEAU,
                    entity,
                    f"Loss of job {name} stopped improving early in its run: {gain / ref:.2%} over the "
                    f"last {window:.0f} s after falling {drop / ref:.2%} to it from its start (noise "
                    f"{noise / ref:.2%}; smoothed {job.smooth:.4g})",
                    value=job.smooth,
                    details={
                        "window_seconds": window,
                        "smoothed_loss": job.smooth,
                        "gain": gain,
                        "drop": drop,
                        "noise": noise,
                    },
                )
            )
        elif job.short_on:
            gain, pace, noise = job.short_seen
            ref = abs(job.smooth) or 1.0
            out.append(
                Finding(
                    PLATEAU,
                    entity,
                    f"Loss of job {name} has stopped improving: {gain / ref:.2%} over the last "
                    f"{self.plateau_short:.0f} s after {pace / ref:.2%} per {self.plateau_short:.0f} s "
                    f"before (noise {noise / ref:.2%}; smoothed {job.smooth:.4g})",
                    value=job.smooth,
                    details={
                        "window_seconds": self.plateau_short,
                        "smoothed_loss": job.smooth,
                        "gain": gain,
                        "pace_before": pace,
                        "noise": noise,
                    },
                )
            )
        elif job.plateau_checks >= 5:
            out.append(
                Finding(
                    PLATEAU,
                    entity,
                    f"Loss of job {name} has not improved by {self.plateau_gain:.2%} over the last "
                    f"{self.plateau_window:.0f} s (smoothed {job.smooth:.4g})",
                    value=job.smooth,
                    details={"window_seconds": self.plateau_window, "smoothed_loss": job.smooth},
                )
            )
        return out
