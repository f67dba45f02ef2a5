"""One rank against its peers: ``training_straggler``, ``gradient_skew``, ``memory_fragmentation``.

Per closed step every rank gets a *lag*: how late it arrived at the collective beyond the peer
reference (``collective_arrival_skew_seconds``, as a share of the step time) or, when ranks report
their own step times instead, how much longer its step took than the reference. The reference is
the job-wide factor times the ranks' median level: the factor is the ``ref_quantile`` quantile,
not the median, of each rank's pace over its own level (learned while healthy), so it stays with
the healthy ranks when up to three quarters of them slow down together (a shared switch, a bad
rack), and fixed offsets, noisy ranks and speed groups do not move it. With speed groups (below)
each rank's group pace is taken out first; a rank far ahead of its own level (it got faster for
good) sits out until its level has caught up. A whole group that slows down stands out, and a rank
that gets faster for good does not drag its old group's reference with it. A rank's lag is the
median of its last ``window`` lags: a one-step data-loader hiccup is not a straggler, and a
straggler that gets worse shows it (no clipping). A straggler's lag is at least ``lag`` behind the
reference (or behind its own normal, where that is ahead of it) *and* ``excess`` (or ``noise_k``
times its own healthy spread, if larger) above its own normal lag, learned while it is neither
slow nor beyond that bar (at most up to ``normal_cap``, or the gap that splits speed groups if
larger), so ranks that are always a little slower (fixed offsets on shared hardware) stay quiet,
for ``sustain`` steps. Where ranks report their own step times those steps must bring ``sustain``
new readings, or last ``sustain_seconds`` with ``short_sustain`` new ones: loggers repeat their
last reading, and copies of one slow reading are not a slowdown that lasted. There (real per-worker
logs) the distances are the rank's own slowdown (a ratio to its normal), the normal follows at
``step_alpha``, and the long window's bar is ``step_k`` times the spread, at least
``step_excess``: a median of nine readings is steadier than one, but a worker's own time wanders
by several per cent for minutes. While that median is more than ``step_learn`` of the bar above the
normal, for at most one ``window`` of steps in a row, the normal follows at ``step_learn_rate`` of
its rate: a slowdown building up towards the bar does not teach the normal that it is normal (on a
noisy worker a 1.2x minute sits near its bar), and a shift that lasts longer than the window that
judges it becomes the new normal as before. A noisy worker's small lasting lag (1.15-1.2x on 10 %
noise per reading, under three spreads) stands out by evidence that grows with time instead: a
one-sided CUSUM of each reading's rise over the rank's recent level (the median of its last
``level_window`` readings, or its normal where that is higher), each adding what it is above half
of ``step_shift`` and at most four spreads, holds at ``step_h`` spreads; then the floor
``step_excess`` is bar enough. A worker whose pace drifts up by small steps sets a new recent level
each time, so the trailing normal does not make a straggler of it; an alert spends its evidence.
Slowdowns of a minute on a job that reports every 10 s are over before that median moves, so the
median of the last ``short`` lags also decides, with the higher bar ``short_excess``, once it has
held for ``short_sustain`` steps and ``short_seconds``: one or two slow readings are no straggler.
Once flagged, a straggler stays flagged until its smoothed lag is back within half of both bars (its
normal keeps learning meanwhile, at ``step_learn_rate`` of its rate, so a lasting shift is not held
for good): a slowdown near its bar is one alert for as long as it lasts, not a new one each time
its median dips under the bar. While flagged, a slowdown that grows by the rule's stage bar (a
quarter) over the one its alert last told, for the bar's hold (:attr:`gpuscope.rules.RuleSpec.stages`),
is a new stage of worsening (:mod:`gpuscope.detect.worsening`), told again by the alert layer.

The step counts above were set on traces that read every 10 s. A rank whose own step times are
read more often (one step a second: ``_reads`` is 10) is judged in time instead: its normal learns
at ``step_alpha`` over that many of its rate, its evidence's level spans that many times the
readings, a copy of a reading adds no evidence, and the hold lets go after that many steps back
within half its bars.
A verdict by five new readings (five seconds) also needs its smoothed lag half way to its bars for
``sustain_seconds``, unless its evidence clears a bar ``step_h_growth`` higher per e-fold of that
ratio (a CUSUM's false alarms come per reading) or its median is beyond the short window's bar:
healthy ranks with 10 % noise per reading were flagged for 1-11 s several times a day on their
noise alone. At one step every 10 s all of it is as before.

A log that repeats its readings (28-49 % of the real 10-s logs' readings are copies of the last one)
fills the windows with copies: a median of nine steps can be one high reading logged five times.
So a verdict by the long window, or by the evidence, needs ``short_sustain`` distinct readings that
tell of it (``_telling``: new, and as far behind as its median must be, or as the floor where the
evidence judges), counted over the window when the run began and the run itself; the short
window's two slow steps must be two readings; and at one step every 10 s a reading adds to the
evidence once and its first copy once more (a step that outlasted the log's interval; the real logs
mostly repeat a reading once), further copies nothing.

Jobs with two or more stable speeds (mixed hardware, a slow placement): for the first
``warm_steps`` steps each rank's raw pace is only recorded. Then the ranks are clustered by their
median lag: sorted, they split at every gap of at least ``split_gap`` of a step (and ``noise_k``
times the ranks' typical spread); a rank apart from all others is a group of its own (real jobs
mix parts). Each rank is then judged against the common reference moved by its group's pace, the
warm-up is replayed that way to learn its normal, and a job whose slower groups were slow from
the start gets one ``slow_placement`` finding that names them and the share of the job's GPU time
they cost (a synchronous job runs at the pace of its slowest group); it is a placement to fix,
not a live fault. Only an offset present from the start and without a cause is a placement: a
rank whose first ``warm_steps / 4`` steps kept the fast group's pace slowed down inside the warm-up
(a live fault: it joins the fast group, its normal learned from those first steps); a rank whose
GPU (or node) has a live hardware finding during the warm-up (a throttle, a slow GPU, an ECC storm:
:mod:`gpuscope.detect.hwfaults`) is held, neither learned nor judged, until the finding has cleared,
then the groups are learned again with it; and a slow group that catches up (the median of its
ranks more than half its lag ahead of its reference) is no longer reported and the groups are
learned again: a placement does not heal on its own.

When the job's membership changes after the warm-up (a rank joins, elastic growth, or a rank comes
back on another node or GPU after a restart), the groups are learned again over the next
``warm_steps`` steps while the old ones keep judging. A rank that is judged slow then, or whose pace
got worse by the split gap since it was last learned, keeps its old group and pace: a live fault
never becomes the new normal. Ranks whose group changed (and new ones) learn their normal again.

A job of two ranks has no peer median: each rank is judged by its arrival lag behind the other's
(the first to arrive is the reference), with the same normal, bars and hold. Which of the two is
slow, rather than its peer faster, the job's own step time tells: in synchronous data parallel a
straggler sets the pace, so the median of the job's last few step times must have grown over its
pace, learned while neither rank was behind, by half the straggler's lag at least. Two ranks that
report only their step times (one and the same) say nothing of each other. What differs between a
job of two ranks and a larger one lives in its reference (:class:`_PairReference`,
:class:`_PeerReference`), chosen per job in one place (``RankDetector._reference_of``).

Gradient skew: a rank's smoothed log-ratio of gradient norm to the peer median beyond
``log(skew_ratio)``. Fragmentation: a rank's allocator fragmentation ``frag_rise`` above its own
early level, or allocator retries climbing; these verdicts need ``sustain`` steps in a row.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuscope.detect.base import StepDetector, register
from gpuscope.detect.jobs import place_text
from gpuscope.detect.steps import StepView
from gpuscope.detect.vectors import speed_groups
from gpuscope.detect.worsening import Worsening
from gpuscope.model import Event, Finding, FloatArray
from gpuscope.rules import GRADIENT_SKEW as SKEW
from gpuscope.rules import MEMORY_FRAGMENTATION as FRAG
from gpuscope.rules import SLOW_PLACEMENT as PLACEMENT
from gpuscope.rules import TRAINING_STRAGGLER as STRAGGLER
from gpuscope.rules import stages_of

STAGES = stages_of(STRAGGLER)


@dataclass(slots=True)
class _Rank:
    lag: float = math.nan
    lags: deque[float] = field(default_factory=deque)  # the last ``window`` lags
    #: of those steps, which brought a new reading (``_telling``)
    fresh: deque[bool] = field(default_factory=deque)
    lag_base: float = math.nan
    lag_spread: float = 0.0  # mean absolute deviation of its raw lags from their median, while healthy
    #: its own pace (over its group's), learned while healthy: its share of the job-wide factor
    level: float = math.nan
    level_n: int = 0
    lag_n: int = 0
    lag_hits: int = 0
    #: of those steps in a row, how many brought a new reading (per-worker step times: a logger
    #: that repeats its last reading adds a step, not evidence), and when the run began
    new_hits: int = 0
    #: the readings that tell of that run's slowdown (``_telling``), counted over the long window
    #: when the run began and then over the run: copies of one high reading are one
    told: int = 0
    slow_since: float = math.nan
    #: when its smoothed lag last got more than half way to its bars (``_held``'s test) and has
    #: stayed there since: the time a verdict by the long window's median is counted from
    near_since: float = math.nan
    #: its last slow step needs no time: arrival lags, or its evidence over its bar, or its
    #: long window's median beyond the short window's (higher) bar
    sure: bool = False
    #: seconds between its steps (a running mean): how many readings it gets in a time (``_reads``)
    gap: float = math.nan
    #: its last raw reading (per-worker step time): a repeat of it is no new reading
    last_raw: float = math.nan
    copies: int = 0  # of it in a row, just before this step's reading
    #: per-worker step times: a one-sided CUSUM of its readings over its level (``_evidence``)
    evidence: float = 0.0
    #: slow last step by that evidence alone, its smoothed lag under its noise bar
    evident: bool = False
    #: its evidence over the bar that needs no time (``_sure_bar``) at its last step
    proven: bool = False
    #: its last raw lags (``level_window`` of them): the level that evidence is measured from
    history: deque[float] = field(default_factory=deque)
    #: flagged a straggler: held until its smoothed lag is back within half its bars (``_held``)
    flagged: bool = False
    #: flagged, steps in a row its smoothed lag has been back within half its bars: at one step a
    #: second (per-worker step times) the hold lets go after ``_reads`` of them, one step at 10 s
    loose: int = 0
    short_hits: int = 0  # steps in a row the short window has been far behind
    short_since: float = math.nan  # when it began
    #: the readings past the short bar that run has seen, those in the short window when it
    #: began included (``_short_slow``)
    short_new: int = 0
    rising_n: int = 0  # steps in a row its step time has been more than half its bar above its normal
    last_ts: float = math.nan  # of the last step judged
    recent: list[float] = field(default_factory=list)  # the last few unsmoothed lags: what is said
    #: while flagged, the median of ``recent`` at the last step it still cleared the bars: a rank
    #: that recovers stays flagged until the smoothed lag follows, and must not read "-0 % behind"
    said: float = math.nan
    said_step: float = math.nan  # the job's step time then
    skew: float = math.nan
    skew_hits: int = 0
    frag0: list[float] = field(default_factory=list)
    frag_base: float = math.nan  # median of the first values, once there are enough
    frag: float = math.nan
    #: flagged a straggler: its stages of worsening, in its slowdown (1 + how far behind)
    worse: Worsening = field(default_factory=Worsening)
    retries: list[tuple[float, float]] = field(default_factory=list)  # (ts, total), last few minutes
    frag_hits: int = 0
    arrival: float = math.nan
    seen: float = -math.inf


@dataclass(slots=True)
class _Groups:
    """A job's speed groups, as its last warm-up learned them."""

    #: each rank's speed group (0: fastest); None until the first warm-up has ended
    of: dict[int, int] | None = None
    #: group -> its median lag behind the fastest group, as a share of a step
    lag: dict[int, float] = field(default_factory=dict)
    #: rank -> the median pace of its speed group (lag behind the whole job's reference) when the
    #: groups were learned: taken out before the common reference is drawn
    pace: dict[int, float] = field(default_factory=dict)
    #: rank -> the job's step time then: an arrival lag is a fixed time, its share of a step shrinks
    #: when the step gets longer (a straggler elsewhere holds everyone up)
    step: dict[int, float] = field(default_factory=dict)
    #: the gap that split the groups: within a group a rank's normal offset may be up to this
    gap: float = 0.0
    #: lags are shares of a step (arrival skew) rather than step-time ratios minus one
    additive: bool = True
    #: rank -> its own pace (median lag behind the job's reference) when the groups were learned
    own: dict[int, float] = field(default_factory=dict)
    #: rank -> (node, gpu) it ran on when the groups were learned
    place: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class _Learning:
    """A warm-up in progress, and the ranks kept out of the groups."""

    #: warm-up steps: (ranks, raw paces, additive, ts), replayed once the groups are known
    steps: list[tuple[list[int], FloatArray, bool, float]] = field(default_factory=list)
    #: the groups are being learned again after a change of membership
    again: bool = False
    #: ranks whose GPU had a live hardware finding during the warm-up being learned
    faulted: set[int] = field(default_factory=set)
    #: ranks held out of the groups for a hardware fault on their GPU: neither learned nor judged
    #: until it has cleared, then the groups are learned again with them
    held: set[int] = field(default_factory=set)
    #: ranks released from a hold, learned afresh at the end of the next warm-up
    released: set[int] = field(default_factory=set)

    def restart(self) -> None:
        """Learn the speed groups again from a fresh warm-up."""
        self.again, self.steps, self.faulted = True, [], set()


@dataclass(slots=True)
class _Pace:
    """A job's step time while no rank is behind: a two-rank job's straggler slows it
    (:class:`_PairReference`)."""

    #: a running mean of the median of ``steps``, learned while no rank is behind
    pace: float = math.nan
    n: int = 0
    #: its last few step times: one step held up by a data-loader hiccup is not a slower job
    steps: deque[float] = field(default_factory=lambda: deque(maxlen=5))


@dataclass(slots=True)
class _Job:
    ranks: dict[int, _Rank] = field(default_factory=dict)
    step_time: float = math.nan
    pace: _Pace = field(default_factory=_Pace)
    groups: _Groups = field(default_factory=_Groups)
    learning: _Learning = field(default_factory=_Learning)


class _Reference(Protocol):
    """What a job's ranks are judged against: the one place a job of two ranks differs from a
    larger one (``RankDetector._reference_of`` chooses)."""

    #: how many ranks must report a step for it to be judged
    need: int
    #: whether self-reported step times tell the ranks apart (a two-rank job's are one and the same)
    step_times: bool
    #: whether a rank's gradient norm is judged against its peers' median (``gradient_skew``)
    skew: bool

    def lags(
        self, job: _Job, rank_ids: list[int], own: FloatArray, additive: bool, levels: bool
    ) -> FloatArray:
        """Each rank's lag behind the reference, from its pace with its group's taken out (``own``,
        two finite at least)."""
        ...

    def stepped(self, job: _Job) -> None:
        """After a step's lags were judged."""
        ...

    def confirmed(self, job: _Job, state: _Rank) -> bool:
        """Is a flagged rank slow itself, rather than its peers faster?"""
        ...


class _PeerReference:
    """Jobs of three ranks or more: the job-wide factor on the ranks' median level (the module's
    first paragraph); its peers tell that a rank behind is slow."""

    need = 3
    step_times = True
    skew = True

    def __init__(self, ref_quantile: float, short_excess: float) -> None:
        self.ref_quantile, self.short_excess = ref_quantile, short_excess

    def lags(
        self, job: _Job, rank_ids: list[int], own: FloatArray, additive: bool, levels: bool
    ) -> FloatArray:
        """Once the ranks' own levels are known (``levels``), the reference is the job-wide factor,
        the ``ref_quantile`` of each rank's pace over its own level, on the median level: fixed
        offsets, noisy ranks and ranks that changed speed for good do not move it, nor does a whole
        group or up to three quarters of the ranks slowing down. Before that, the ``ref_quantile``
        of the paces themselves."""
        known = np.array([job.ranks[r].level if r in job.ranks else math.nan for r in rank_ids])
        ok = np.isfinite(own) & np.isfinite(known) & (additive or known > 0)
        if levels and ok.sum() >= 3:
            level = float(np.median(known[ok]))
            over = own[ok] - known[ok] if additive else own[ok] / known[ok]
            # a rank far ahead of its own level changed speed for good: until its level has caught
            # up it says nothing about the job-wide factor (a quarter of the ranks getting faster
            # at once would move the quantile); a job that got faster as a whole keeps them all
            steady = over >= (-self.short_excess if additive else 1.0 - self.short_excess)
            factor = float(np.quantile(over[steady] if steady.sum() >= 3 else over, self.ref_quantile))
            common = factor + level if additive else factor * level
        else:
            common = float(np.nanquantile(own, self.ref_quantile))
        out: FloatArray = own - common if additive else own / common - 1.0
        return out

    def stepped(self, job: _Job) -> None:
        pass

    def confirmed(self, job: _Job, state: _Rank) -> bool:
        return True


class _PairReference:
    """Jobs of two ranks: no peer median; each rank's arrival lag behind the other's, and the job's
    step time tells which one is slow (the module's paragraph on two ranks). Arrivals only: their
    self-reported step times are one and the same."""

    need = 2
    step_times = False
    skew = False

    def __init__(self, base_alpha: float) -> None:
        self.base_alpha = base_alpha

    def lags(
        self, job: _Job, rank_ids: list[int], own: FloatArray, additive: bool, levels: bool
    ) -> FloatArray:
        # the first to arrive is the reference (a quantile between the two would split the late
        # one's lag between them); which one is slow, not faster, the job's step time tells
        out: FloatArray = own - float(np.min(own))
        return out

    def stepped(self, job: _Job) -> None:
        """The job's step time (the median of its last few), learned while neither rank is behind:
        in synchronous data parallel a straggler sets the job's pace, a rank that got faster does
        not."""
        if not math.isfinite(job.step_time):
            return
        pace = job.pace
        pace.steps.append(job.step_time)
        if any(s.flagged or s.lag_hits or s.short_hits for s in job.ranks.values()):
            return
        now = _median(pace.steps)
        pace.n += 1
        old = pace.pace if math.isfinite(pace.pace) else now
        pace.pace = old + max(self.base_alpha, 1.0 / pace.n) * (now - old)

    def confirmed(self, job: _Job, state: _Rank) -> bool:
        """The job's step time must have grown by half of the rank's lag at least (its lag is a
        share of the longer step, as is the growth)."""
        lag = state.said if math.isfinite(state.said) else state.lag
        behind = lag - min(state.lag_base, 0.0) if math.isfinite(state.lag_base) else lag
        pace = job.pace
        now = _median(pace.steps) if pace.steps else math.nan
        grown = 1.0 - pace.pace / now if pace.pace > 0 and now > 0 else math.nan
        return math.isfinite(grown) and grown >= 0.5 * behind


@register
class RankDetector(StepDetector):
    rules = (STRAGGLER, SKEW, FRAG, PLACEMENT)

    def __init__(
        self,
        window: int = 9,
        base_alpha: float = 0.02,
        lag: float = 0.06,
        excess: float = 0.05,
        ref_quantile: float = 0.25,
        noise_k: float = 5.0,
        normal_cap: float = 0.15,
        skew_ratio: float = 1.35,
        frag_rise: float = 0.05,
        retry_window: float = 300.0,
        min_retries: float = 5.0,
        sustain: int = 5,
        sustain_seconds: float = 30.0,
        warm_steps: int = 20,
        split_gap: float = 0.1,
        short: int = 3,
        short_excess: float = 0.15,
        short_sustain: int = 3,
        short_seconds: float = 30.0,
        step_excess: float = 0.1,
        step_k: float = 3.0,
        step_alpha: float = 0.05,
        step_learn: float = 0.5,
        step_learn_rate: float = 0.25,
        step_shift: float = 0.15,
        step_h: float = 8.0,
        step_h_growth: float = 0.35,
        level_window: int = 30,
    ) -> None:
        self.step_excess, self.step_k, self.step_alpha = step_excess, step_k, step_alpha
        self.step_learn, self.step_learn_rate = step_learn, step_learn_rate
        self.step_shift, self.step_h, self.level_window = step_shift, step_h, level_window
        self.step_h_growth = step_h_growth
        self.window, self.base_alpha, self.lag, self.excess = window, base_alpha, lag, excess
        self.ref_quantile, self.noise_k = ref_quantile, noise_k
        self.normal_cap = normal_cap
        self.skew_log = math.log(skew_ratio)
        self.frag_rise, self.retry_window, self.min_retries = frag_rise, retry_window, min_retries
        self.sustain, self.warm_steps, self.split_gap = sustain, warm_steps, split_gap
        self.sustain_seconds = sustain_seconds
        self.short, self.short_excess, self.short_sustain = short, short_excess, short_sustain
        self.short_seconds = short_seconds
        super().__init__()
        self._jobs: dict[str, _Job] = {}
        self._peers = _PeerReference(ref_quantile, short_excess)
        self._pair = _PairReference(base_alpha)

    def _reference_of(self, job: _Job) -> _Reference:
        """The reference a job's ranks are judged against: a job of two ranks has no peer median.
        A job's ranks are never forgotten (a new job starts afresh), so a job that grew past two
        is judged by its peers from then on (a rank the groups do not know: they are learned
        again, ``_moved``), and two ranks of a larger job that report a step alone are not judged."""
        return self._pair if len(job.ranks) == 2 else self._peers

    def on_event(self, event: Event) -> None:
        if event.kind in ("job_started", "job_ended", "job_failed"):
            self._jobs.pop(event.labels.get("job", ""), None)  # new processes: new baselines

    def findings(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for name, job in self._jobs.items():
            stale = max(60.0, 10.0 * job.step_time) if math.isfinite(job.step_time) else 60.0
            for rank, state in job.ranks.items():
                if now - state.seen > stale:
                    continue  # a rank that stopped reporting is rank_lost's business
                out.extend(self._findings(name, job, rank, state, now))
            out.extend(self._placement(name, job))
        return out

    def step(self, view: StepView) -> None:
        job = self._jobs.get(view.job)
        if job is None or view.rollback:
            job = self._jobs[view.job] = _Job()
        ranks = [
            job.ranks.get(r)
            or job.ranks.setdefault(r, _Rank(lags=deque(maxlen=self.window), fresh=deque(maxlen=self.window)))
            for r in view.ranks
        ]
        for state in ranks:
            state.seen = view.ts
        step = view.get("step_seconds")
        finite = step[np.isfinite(step)]
        if finite.size:
            job.step_time = float(np.median(finite))
        reference = self._reference_of(job)
        if len(ranks) >= reference.need:  # two ranks of a larger job are not judged
            self._lags(job, view, ranks, step, reference.need, reference.step_times)
            reference.stepped(job)
            if reference.skew:
                self._skew(view, ranks)
        self._frag(view, ranks)

    def _lags(
        self, job: _Job, view: StepView, ranks: list[_Rank], step: FloatArray, need: int, step_times: bool
    ) -> None:
        """``need``: the ranks that must report; ``step_times``: whether their own step times may
        stand in for arrivals (the job's :class:`_Reference`)."""
        arrival = view.get("collective_arrival_skew_seconds")
        if np.isfinite(arrival).sum() < need:  # the SDK reports each rank's own gap; the median is the same
            arrival = view.get("collective_arrival_gap_seconds")
        if np.isfinite(arrival).sum() >= need and job.step_time > 0:
            raw, additive = arrival / job.step_time, True
        elif step_times and np.isfinite(step).sum() >= need:
            raw, additive = step, False
        else:
            return
        for state, arrived in zip(ranks, arrival.tolist(), strict=True):
            if math.isfinite(arrived):
                state.arrival = arrived
        if job.groups.of is None:
            self._warm(view.job, job, view.ranks)
            job.learning.steps.append((list(view.ranks), raw.copy(), additive, view.ts))
            if len(job.learning.steps) >= self.warm_steps:
                self._split(view.job, job)
            return
        present = [r for r, x in zip(view.ranks, raw.tolist(), strict=True) if math.isfinite(x)]
        released = {r for r in job.learning.held if not self.faults.on(self.steps.where(view.job, r))}
        if released:
            # the hardware fault that held them has cleared: learn the groups again with them
            job.learning.held -= released
            job.learning.released |= released
            job.learning.restart()
        elif not job.learning.again and self._moved(view.job, job, present):
            job.learning.restart()
        if not job.learning.again and self._healed(job):
            # a slow group that caught up was no placement (a placement does not heal on its own)
            job.learning.restart()
        self._judge(job, list(view.ranks), raw, additive, view.ts)
        if job.learning.again:
            self._warm(view.job, job, view.ranks)
            job.learning.steps.append((list(view.ranks), raw.copy(), additive, view.ts))
            if len(job.learning.steps) >= self.warm_steps:
                self._split(view.job, job)

    def _warm(self, name: str, job: _Job, ranks: tuple[int, ...] | list[int]) -> None:
        """Note the ranks of a warm-up step whose GPU has a live hardware finding."""
        for r in ranks:
            if r not in job.learning.faulted and self.faults.on(self.steps.where(name, r)):
                job.learning.faulted.add(r)

    def _healed(self, job: _Job) -> bool:
        """Has a slow speed group caught up with the fast one?"""
        return bool(job.groups.lag) and len(self._slow_groups(job)) < len(job.groups.lag)

    def _slow_groups(self, job: _Job) -> dict[int, float]:
        """The slower speed groups that are still slow: group -> its lag behind the fast group.

        A group's ranks are judged against the reference moved by their group's pace, so a group
        that caught up lags that pace behind its own reference: it is healed once the median of
        its ranks' lags is more than half its lag ahead of it."""
        lags: dict[int, list[float]] = {}
        for r, g in (job.groups.of or {}).items():
            state = job.ranks.get(r)
            if g and state is not None and math.isfinite(state.lag) and r not in job.learning.held:
                lags.setdefault(g, []).append(state.lag)
        out: dict[int, float] = {}
        for g, lag in job.groups.lag.items():
            mine = lags.get(g)
            if mine is None:
                out[g] = lag  # not judged yet: as learned
                continue
            now = _median(mine)
            healed = (
                now <= -0.5 * lag if job.groups.additive else (1.0 + now) * (1.0 + lag) <= 1.0 + 0.5 * lag
            )
            if not healed:
                out[g] = lag
        return out

    def _moved(self, name: str, job: _Job, ranks: list[int]) -> bool:
        """A rank the groups do not know, or one that now runs somewhere else."""
        group = job.groups.of or {}
        for r in ranks:
            if r not in group:
                return True
            where = self.steps.where(name, r)
            if "node" in where and job.groups.place.get(r, (where["node"], where.get("gpu", ""))) != (
                where["node"],
                where.get("gpu", ""),
            ):
                return True
        return False

    def _reference(
        self, job: _Job, rank_ids: list[int], raw: FloatArray, additive: bool, levels: bool = True
    ) -> tuple[FloatArray, FloatArray]:
        """Each rank's pace with its group's taken out, and its lag behind the job's reference
        (:class:`_Reference`; ``levels``: the ranks' own levels may be used, once known).

        The groups' paces, learned with the groups, are taken out first, so that every rank of the
        job (not only the few of its group) sets the common reference."""
        pace = np.array([job.groups.pace.get(r, 0.0) for r in rank_ids])
        if additive and job.step_time > 0:
            pace *= np.array([job.groups.step.get(r, job.step_time) for r in rank_ids]) / job.step_time
        own = raw - pace if additive else raw / (1.0 + pace)
        if np.isfinite(own).sum() < 2:
            return own, np.full(len(raw), math.nan)
        return own, self._reference_of(job).lags(job, rank_ids, own, additive, levels)

    def _split(self, name: str, job: _Job) -> None:
        """End of a warm-up: group the ranks by pace, then learn each one's normal in its group.

        After a change of membership, a rank that is slow now or got slower keeps its group."""
        old, old_pace, old_group_pace, old_step = (
            job.groups.of or {},
            job.groups.own,
            job.groups.pace,
            job.groups.step,
        )
        job.groups.of, job.groups.pace = {}, {}  # the paces are lags behind the whole job's reference
        seen: dict[int, list[float]] = {}
        early: dict[int, list[float]] = {}  # the lags of the first ``onset`` steps of the warm-up
        onset = max(3, len(job.learning.steps) // 4)
        for i, (rank_ids, raw, additive, _) in enumerate(job.learning.steps):
            _, lags = self._reference(job, rank_ids, raw, additive, levels=False)
            for r, x in zip(rank_ids, lags.tolist(), strict=True):
                if math.isfinite(x):
                    seen.setdefault(r, []).append(x)
                    if i < onset:
                        early.setdefault(r, []).append(x)
        # a rank whose GPU had a hardware fault during the warm-up has a cause, not a placement:
        # it is held out until the fault has cleared (its pace now says nothing about its normal)
        job.learning.held |= {
            r for r in seen if r in job.learning.faulted or self.faults.on(self.steps.where(name, r))
        }
        job.learning.faulted = set()
        for r in job.learning.held:
            seen.pop(r, None)
        paces = {r: float(np.median(xs)) for r, xs in seen.items()}
        noise = [float(np.median(np.abs(np.array(xs) - paces[r]))) for r, xs in seen.items()]
        gap = max(self.split_gap, self.noise_k * float(np.median(noise))) if noise else self.split_gap
        kept = {
            r
            for r, p in paces.items()
            if r in old
            and (
                job.ranks[r].lag_hits > 0
                or job.ranks[r].flagged
                or job.ranks[r].short_hits > 0
                or (r in old_pace and p - old_pace[r] >= gap)
            )
        }
        learn = {r: p for r, p in paces.items() if r not in kept}
        # a rank that is its own speed from the start is a placement of one (real jobs mix parts)
        group = speed_groups(learn, gap, min_size=1) if len(learn) >= 4 else dict.fromkeys(learn, 0)
        # a slower rank whose first steps kept the fast group's pace slowed down inside the
        # warm-up: a live fault, not a placement; it joins the fast group, its normal learned from
        # its first steps only (``cut``), and is judged from now on
        fast_paces = [p for r, p in learn.items() if group[r] == 0]
        cut = {
            r
            for r, g in group.items()
            if g
            and fast_paces
            and len(early.get(r, ())) >= 3
            and _median(early[r]) < _median(fast_paces) + 0.5 * gap
        }
        for r in cut:
            learn[r], group[r] = _median(early[r]), 0
        group.update({r: old.get(r, 0) for r in kept})
        group.update(dict.fromkeys(job.learning.held - set(group), 0))
        job.groups.of = group
        job.groups.gap = gap
        job.groups.lag = {}
        fast = [p for r, p in learn.items() if group[r] == 0]
        for g in set(group.values()):
            mine = [p for r, p in learn.items() if group[r] == g]
            if mine:
                job.groups.pace.update(
                    dict.fromkeys((r for r in learn if group[r] == g), float(np.median(mine)))
                )
            if g and mine:
                job.groups.lag[g] = float(np.median(mine)) - (float(np.median(fast)) if fast else 0.0)
        job.groups.pace.update({r: float(np.median(fast)) if fast else 0.0 for r in job.learning.held})
        job.groups.step = dict.fromkeys(job.groups.pace, job.step_time)
        job.groups.pace.update({r: old_group_pace.get(r, 0.0) for r in kept})
        job.groups.step.update({r: old_step.get(r, job.step_time) for r in kept})
        job.groups.additive = job.learning.steps[-1][2]
        job.groups.own = {**old_pace, **learn}
        job.groups.place = {}
        for r in group:
            where = self.steps.where(name, r)
            if "node" in where:
                job.groups.place[r] = (where["node"], where.get("gpu", ""))
        # a first warm-up replays every rank; a later one only those it moved (or that are new)
        fresh = set(group) if not old else {r for r in group if r not in old or group[r] != old[r]}
        fresh |= job.learning.released & set(group)
        job.learning.released = set()
        for r in fresh & set(job.ranks):
            state = job.ranks[r]
            state.lags.clear()
            state.fresh.clear()
            state.recent.clear()
            state.lag, state.lag_base, state.lag_spread, state.said = math.nan, math.nan, 0.0, math.nan
            state.lag_n = state.lag_hits = state.new_hits = state.short_hits = 0
            state.flagged = state.evident = state.proven = False
            state.evidence = 0.0
            state.history.clear()
        # a rank whose group pace moved has its own pace on a new scale: it learns it again
        moved = fresh | {r for r, p in old_group_pace.items() if job.groups.pace.get(r) != p}
        for r in moved & set(job.ranks):
            job.ranks[r].level, job.ranks[r].level_n = math.nan, 0
        warm, job.learning.steps, job.learning.again = job.learning.steps, [], False
        for i, (rank_ids, raw, additive, ts) in enumerate(warm):
            self._judge(
                job, rank_ids, raw, additive, ts, fresh - job.learning.held - (cut if i >= onset else set())
            )
        for r in cut & set(job.ranks):
            job.ranks[r].lag_n = max(job.ranks[r].lag_n, self.warm_steps)  # its normal is known

    def _judge(
        self,
        job: _Job,
        rank_ids: list[int],
        raw: FloatArray,
        additive: bool,
        ts: float,
        only: set[int] | None = None,
    ) -> None:
        own, lags = self._reference(job, rank_ids, raw, additive)
        for r, x, mine, reading in zip(rank_ids, lags.tolist(), own.tolist(), raw.tolist(), strict=True):
            state = job.ranks.get(r)
            if (
                state is None
                or not math.isfinite(x)
                or (only is not None and r not in only)
                or r in job.learning.held
            ):
                continue
            # an arrival lag is measured at each collective; a self-reported step time that equals
            # the rank's last one is the logger repeating it (the real per-worker logs repeat 28-60 %
            # of their readings), not a second step at that pace
            new = additive or reading != state.last_raw
            state.last_raw = reading
            state.copies = 0 if new else state.copies + 1
            state.recent.append(x)
            del state.recent[: -self.sustain]
            if ts > state.last_ts:  # a replayed warm-up goes back in time: no gap
                gap, last = ts - state.last_ts, state.gap
                state.gap = gap if not math.isfinite(last) else last + self.step_alpha * (gap - last)
            state.last_ts = ts
            reads = self._reads(state)  # by the gap, which nothing below moves
            state.lags.append(x)
            state.fresh.append(new)
            state.lag = _median(state.lags)
            state.lag_n += 1
            judged = state.lag_n >= self.warm_steps
            # the normal is learned while not judged slow, nor beyond the bar (a slowdown that has
            # not yet held long enough must not become its own reference)
            rise = self._rise(state.lag, state.lag_base, additive)
            bar = self._bars(state, additive)[0]
            beyond = judged and rise >= bar
            # a step time building up towards the bar is learned slowly, for one window at most
            rising = judged and not additive and rise >= self.step_learn * bar
            state.rising_n = state.rising_n + 1 if rising else 0
            rising = rising and state.rising_n <= self.window
            # a rank slow by its evidence alone is under its noise bar: a lasting shift that size
            # becomes its normal, slowly, as a held straggler's does
            if (state.lag_hits == 0 or state.evident) and state.short_hits == 0 and not beyond:
                # a running mean at first, so the normal does not hang on the first sample
                # per time, not per step: at one step a second the normal must not learn a
                # slowdown in the 30 s that ``_sustained`` asks of it
                rate = self.base_alpha if additive else self.step_alpha / reads
                alpha = max(rate, 1.0 / state.lag_n)
                # within its speed group a rank may be slower by up to the gap that splits groups
                learn = min(state.lag, max(self.normal_cap, job.groups.gap))
                base = state.lag_base if math.isfinite(state.lag_base) else learn
                # a straggler held under its bar (``_held``) is learned slowly too: a slowdown must
                # not become the normal in the minute it takes to dip under the bar, a lasting shift
                # still does
                # and so is a rank whose evidence is half way to its bar: a small lag on a noisy
                # worker sits under the bar where ``rising`` applies, and must not be learned
                # before the evidence can tell it (a drift moves the recent level that the
                # evidence is measured from, so it is learned as before)
                slowly = rising or state.flagged or state.evidence > 0.5 * self._evidence_bar(state)
                state.lag_base = base + (self.step_learn_rate * alpha if slowly else alpha) * (learn - base)
                # a data-loader hiccup is an outlier, not the spread of the rank's pace; a repeated
                # reading is no measure of it either: it sits on the median its copies make, so
                # repeats made the spread, and every bar drawn from it, too low
                if new:
                    spread = min(abs(self._rise(x, state.lag, additive)), 0.1)
                    state.lag_spread += alpha * (spread - state.lag_spread)
                state.level_n += 1
                level = state.level if math.isfinite(state.level) else mine
                state.level = level + max(alpha, 1.0 / state.level_n) * (mine - level)
            long_bar, short_bar = self._bars(state, additive)
            # behind its group's reference, or behind its own normal where that is ahead of the
            # group's (a rank that got faster for good is judged on its own pace)
            ahead = min(state.lag_base, 0.0)
            behind = judged and self._rise(state.lag, ahead, additive) >= self.lag
            rise = self._rise(state.lag, state.lag_base, additive)
            # a copy of a reading adds no evidence where the rank reads faster than it needs to
            # (its bar counts readings). At one step every 10 s a reading logged once more may be
            # a step that outlasted the log's interval (the real logs mostly repeat a reading
            # once), further copies are the logger repeating itself: one high reading logged six
            # times was six readings' worth of evidence on healthy workers with 10 % noise
            once = state.copies == 1 and reads == 1
            evident = not additive and judged and self._evidence(state, x, reads, new or once)
            # a noisy worker's small lasting lag stands out of its noise by evidence that grows
            # with time, not by one window's median: then the floor that real wander asks is enough
            state.evident = behind and self.step_excess <= rise < long_bar and evident
            slow = behind and (rise >= long_bar or state.evident)
            half_way = self._held(state, ahead, long_bar, additive)
            if not (judged and half_way):
                state.near_since = math.nan
            elif not math.isfinite(state.near_since):
                state.near_since = ts
            state.sure = additive or (evident and state.proven) or rise >= short_bar
            # the readings that tell of the slowdown: new, and as far behind as the median must be
            # (those that hold it behind), or as the floor where the evidence judges; a run counts
            # those the window held when it began, since the median is behind only once they are in
            level = self.step_excess if state.evident else long_bar
            telling = additive or (new and self._rise(x, state.lag_base, additive) >= level)
            if slow and not state.lag_hits:
                state.slow_since, state.new_hits = ts, 0
                state.told = 0 if additive else self._telling(state, level) - telling
            state.lag_hits = state.lag_hits + 1 if slow else 0
            state.new_hits = state.new_hits + new if slow else 0
            state.told = state.told + telling if slow else 0
            # a short, large slowdown (a minute on a trace sampled every 10 s) is over before the
            # long window's median moves: the median of the last few lags, with a higher bar
            far = False
            if judged:  # only a judged rank can be far behind: no median to take otherwise
                short = _median(list(state.lags)[-self.short :])
                far = (
                    self._rise(short, ahead, additive) >= self.lag
                    and self._rise(short, state.lag_base, additive) >= short_bar
                )
            if far and not state.short_hits:
                # its median of three is behind on two steps: they must be two readings
                state.short_since = ts
                state.short_new = 1 if additive else self._telling(state, short_bar, self.short)
            elif far:
                state.short_new += additive or (new and self._rise(x, state.lag_base, False) >= short_bar)
            state.short_hits = state.short_hits + 1 if far else 0
            was = state.flagged
            held = state.flagged and half_way
            state.loose = state.loose + 1 if state.flagged and not held else 0
            state.flagged = (
                self._sustained(state, ts)
                or self._short_slow(state)
                or held
                or (state.flagged and not additive and state.loose < reads)
            )
            if not state.flagged:
                if was:
                    state.evidence = 0.0  # an alert spends its evidence: the next one needs its own
                state.said = math.nan
                continue
            # the recent median and this step's own lag both behind: a step that is back to normal
            # pairs the slow steps' shares with its own (short) step time
            now, bar = _median(state.recent), min(long_bar, short_bar)
            if not math.isfinite(state.said) or all(
                self._rise(v, ahead, additive) >= self.lag and self._rise(v, state.lag_base, additive) >= bar
                for v in (now, x)
            ):
                state.said, state.said_step = now, job.step_time

    @staticmethod
    def _rise(lag: float, base: float, additive: bool) -> float:
        """How far ``lag`` is behind ``base`` (none while the normal is unknown): in shares of a
        step for arrival lags, or as the rank's own slowdown for step-time ratios (a rank that
        normally runs 30 % ahead of the reference and slows 1.2x moves its lag by 0.2 x 0.7, but
        its own pace by 20 %)."""
        if not math.isfinite(base):
            return 0.0
        return lag - base if additive else (1.0 + lag) / (1.0 + base) - 1.0

    def _bars(self, state: _Rank, additive: bool) -> tuple[float, float]:
        """How far the long and the short window's median must be behind the rank's normal.

        Noisy ranks (real data loaders, shared hosts) must stand out of their own noise, ``noise_k``
        times their spread. For step times the median of ``window`` readings varies about
        sqrt(window / short) less than that of ``short`` (``step_k`` times the spread, not
        ``noise_k``), but a worker's own step time also wanders for minutes, beyond its noise (up to
        +8 % over 90 s on healthy real workers with 1.5 % noise), hence the floor ``step_excess``."""
        excess = max(self.excess, self.noise_k * state.lag_spread)
        if additive:
            return excess, max(self.short_excess, excess)
        return max(self.step_excess, self.step_k * state.lag_spread), max(self.short_excess, excess)

    def _evidence(self, state: _Rank, x: float, reads: int, new: bool = True) -> bool:
        """Has the rank's step time been slower than its normal long enough to stand out of its own
        noise? A one-sided CUSUM of its readings' rises over its level: each adds what it is above
        half of ``step_shift`` (the smallest slowdown the rule must find; a smaller lag, or the
        wander of a healthy worker, adds nothing on average), at most four of its spreads (one slow
        reading is not a slowdown), and it holds at ``step_h`` spreads. On a worker with 10 % noise
        per reading a 1.15x lag holds within about a dozen readings, where a median of nine would
        need a bar of three spreads (30 %); its evidence, capped at twice the bar, is gone within a
        few readings of the lag's end (the cap is twice ``_sure_bar``, the bar itself at one reading
        every 10 s). ``reads``: the rank's ``_reads``; ``new``: the reading adds to the evidence. At
        a faster cadence its level is the median of ``reads`` times as many readings: the time it
        spans at one every 10 s."""
        sigma = 1.25 * state.lag_spread
        allowance, bar = 0.5 * self.step_shift, self._evidence_bar(state)
        # measured from the rank's recent level where that is above its normal: a worker whose
        # pace drifts up by steps smaller than ``step_shift`` sets a new level (the normal trails
        # it), a step up stands out for the readings the median takes to follow it
        level = max(state.lag_base, _median(state.history)) if state.history else state.lag_base
        state.history.append(x)
        if len(state.history) > self.level_window * reads:
            state.history.popleft()
        rise = min(self._rise(x, level, False), allowance + 4.0 * sigma)
        sure = self._sure_bar(state, reads)
        if new:
            state.evidence = min(2.0 * sure, max(0.0, state.evidence + rise - allowance))
        state.proven = sure > 0 and state.evidence >= sure
        return bar > 0 and state.evidence >= bar

    def _evidence_bar(self, state: _Rank) -> float:
        """``step_h`` of the rank's spreads (sigmas: the mean absolute deviation of a normal reading
        is 0.8 sigma)."""
        return self.step_h * 1.25 * state.lag_spread

    def _sure_bar(self, state: _Rank, reads: int) -> float:
        """The evidence that sustains a verdict without ``_sustained``'s time: the evidence bar,
        higher by ``step_h_growth`` of it per e-fold of readings per ``sustain_seconds`` beyond
        ``short_sustain``. A CUSUM's false alarms come once in so many readings, not seconds: at
        one reading a second healthy workers with 10 % noise per reading cleared the plain bar
        for a few seconds several times a day (docs/scenarios.md, eighteenth round). At one
        reading every 10 s it is the evidence bar."""
        return (1.0 + self.step_h_growth * math.log(reads)) * self._evidence_bar(state)

    def _reads(self, state: _Rank) -> int:
        """How many times more often than ``short_sustain`` per ``sustain_seconds`` the rank reads,
        rounded, at least 1: 1 at one step every 10 s (or a little more often), 10 at one a second.
        The rates and windows that count steps are divided or multiplied by it, so they span the
        same time at every cadence."""
        return max(1, round(self.sustain_seconds / state.gap / self.short_sustain)) if state.gap > 0 else 1

    def _telling(self, state: _Rank, level: float, steps: int = 0) -> int:
        """How many of the window's last ``steps`` steps (all of them: 0) brought a new reading at
        least ``level`` above the rank's normal (per-worker step times): copies of one reading that
        hold a median behind are one reading."""
        pairs = list(zip(state.lags, state.fresh, strict=True))[-steps:]
        return sum(new and self._rise(x, state.lag_base, False) >= level for x, new in pairs)

    def _held(self, state: _Rank, ahead: float, long_bar: float, additive: bool) -> bool:
        """Is a flagged straggler still more than half way to its bars? A slowdown near its bar (a
        1.2x straggler on a worker with 5 % noise per reading) crosses it again and again; one
        alert that lasts as long as the slowdown, not a new one each time its median dips. The
        normal keeps learning meanwhile (slowly), so a lasting shift is not held for good. (At one
        step a second the hold lets go after ``_reads`` steps in a row back under half way.)"""
        return (
            self._rise(state.lag, ahead, additive) >= 0.5 * self.lag
            and self._rise(state.lag, state.lag_base, additive) >= 0.5 * long_bar
        )

    def _sustained(self, state: _Rank, ts: float) -> bool:
        """Slow for ``sustain`` steps in a row, of which ``sustain`` brought new readings, or for
        ``sustain_seconds`` with ``short_sustain`` new readings among them: copies of one slow
        reading are not evidence that it lasted (on a worker with 10 % noise per reading whose
        logger repeats 40 % of its readings, five slow steps are often two or three readings),
        while a trace that reads every 10 s and repeats some of its values has held for the time
        its steps say (the real per-worker traces keep every episode they had). Five readings of a
        worker that reads every second are five seconds: the long window's median of a worker with
        10 % noise per reading crosses a bar of three spreads for that long on its noise alone
        (8 alerts of 1-11 s in 12 hours of 16 healthy ranks), so where its step times alone
        sustain it, its smoothed lag must also have been half way to its bars for
        ``sustain_seconds`` (the hold's test: a noisy straggler that dips under its bar keeps
        the time it has), unless it is ``sure``: its evidence, whose bar grows with the readings
        per ``sustain_seconds``, or a median beyond the short window's bar. At one reading every
        10 s five readings span 40 s: judged as before. Either way ``short_sustain`` readings must tell
        of the slowdown (``told``): on a 10-s log that repeats 40 % of its readings, copies of one or
        two high readings held a median of nine behind, and the new readings that came meanwhile were
        normal ones."""
        if state.lag_hits < self.sustain or state.told < self.short_sustain:
            return False
        held = ts - state.slow_since >= self.sustain_seconds and state.new_hits >= self.short_sustain
        near = state.sure or ts - state.near_since >= self.sustain_seconds
        return (state.new_hits >= self.sustain and near) or held

    def _short_slow(self, state: _Rank) -> bool:
        """Far behind over the short window for ``short_sustain`` steps and ``short_seconds``: a
        blip of one or two samples is no straggler however slow, and a trace that repeats its
        last sample must not make one from a single slow reading (``short_new``: two readings past
        the bar at least)."""
        if state.short_hits < self.short_sustain or state.short_new < 2 or not state.lags:
            return False
        return state.last_ts - state.short_since >= self.short_seconds

    def _skew(self, view: StepView, ranks: list[_Rank]) -> None:
        grads = view.get("grad_norm")
        ok = np.isfinite(grads) & (grads > 0)
        if ok.sum() < 3:
            return
        logs = np.full(len(grads), math.nan)
        logs[ok] = np.log(grads[ok])
        rel = logs - float(np.median(logs[ok]))
        for state, x in zip(ranks, rel.tolist(), strict=True):
            if not math.isfinite(x):
                continue
            state.skew = x if not math.isfinite(state.skew) else state.skew + 0.2 * (x - state.skew)
            state.skew_hits = state.skew_hits + 1 if abs(state.skew) >= self.skew_log else 0

    def _frag(self, view: StepView, ranks: list[_Rank]) -> None:
        frag = view.get("memory_fragmentation_ratio")
        retries = view.get("alloc_retries_total")
        for state, f, r in zip(ranks, frag.tolist(), retries.tolist(), strict=True):
            if math.isfinite(f):
                state.frag = f
                if len(state.frag0) < 30:
                    state.frag0.append(f)
                    if len(state.frag0) >= 10:
                        state.frag_base = _median(state.frag0)
            if math.isfinite(r):
                state.retries.append((view.ts, r))
                while state.retries and view.ts - state.retries[0][0] > self.retry_window:
                    state.retries.pop(0)
            bad = self._frag_rise(state) >= self.frag_rise or self._new_retries(state) >= self.min_retries
            state.frag_hits = state.frag_hits + 1 if bad else 0

    @staticmethod
    def _frag_rise(state: _Rank) -> float:
        if not (math.isfinite(state.frag_base) and math.isfinite(state.frag)):
            return 0.0
        return state.frag - state.frag_base

    @staticmethod
    def _new_retries(state: _Rank) -> float:
        if len(state.retries) < 2:
            return 0.0
        return max(0.0, state.retries[-1][1] - state.retries[0][1])

    def _placement(self, job_name: str, job: _Job) -> list[Finding]:
        groups = self._slow_groups(job) if job.groups.lag else {}
        if not groups:
            return []
        slow = sorted(
            r for r, g in (job.groups.of or {}).items() if g in groups and r not in job.learning.held
        )
        # a synchronous job waits for its slowest group: that wait is lost on all of its GPUs; an
        # arrival lag is already a share of the (slow) step, a step-time ratio r loses (r - 1) / r
        worst = max(groups.values())
        lost = worst if job.groups.additive else worst / (1.0 + worst)
        where = [self.steps.where(job_name, r) for r in slow]
        places = sorted({w.get("node", "") for w in where} - {""})
        # the GPUs the slow ranks run on: a slow GPU's own alert is the cause of this one, however
        # much later it comes (:mod:`gpuscope.alert.incidents`); none known, the job's places link it
        links = sorted(
            ({"node": w["node"], "gpu": w["gpu"]} for w in where if w.get("node") and w.get("gpu")),
            key=lambda x: (x["node"], x["gpu"]),
        )
        on = f" on {', '.join(places)}" if places else ""
        world = len(job.ranks)
        return [
            Finding(
                PLACEMENT,
                {"job": job_name},
                f"Job {job_name} has run at two speeds since it started: ranks {_ranges(slow)}{on} are "
                f"{worst:.0%} of a step slower than the others, so the job loses {lost:.0%} of its "
                f"{world} GPUs' time",
                value=lost,
                affected_gpus=world,
                at_risk=lost,
                details={
                    "slow_ranks": slow,
                    "slow_nodes": places,
                    "group_lag_share": worst,
                    "lost_share": lost,
                    **({"links": links} if links else {}),
                },
            )
        ]

    def _findings(self, job_name: str, job: _Job, rank: int, state: _Rank, now: float) -> list[Finding]:
        straggler = state.flagged and self._reference_of(job).confirmed(job, state)
        if not straggler and math.isfinite(state.worse.told):
            state.worse = Worsening()  # a straggler found again starts its stages again
        if not (straggler or state.skew_hits >= self.sustain or state.frag_hits >= self.sustain):
            return []  # most ranks most seconds: no entity to build
        out: list[Finding] = []
        entity = {"job": job_name, "rank": str(rank), **self.steps.where(job_name, rank)}
        where = f" on {place_text(entity['node'], entity.get('gpu', ''))}" if "node" in entity else ""
        if straggler:
            # the smoothed lag decides; the recent lags say how far behind it is now (the smoothed
            # one still trails a lag that began mid-run), as at the last step they cleared the bars
            now_lag = state.said if math.isfinite(state.said) else state.lag
            step_time = state.said_step if math.isfinite(state.said) else job.step_time
            # it is judged behind its group's reference or behind its own normal where that is
            # ahead (a rank that got faster for good): its lag alone would read "-20 % behind"
            ahead = min(state.lag_base, 0.0) if math.isfinite(state.lag_base) else 0.0
            behind = self._rise(now_lag, ahead, job.groups.additive)
            group = (job.groups.of or {}).get(rank, 0)
            peers = f"the ranks of its speed group {group}" if job.groups.lag else "its peers"
            late = behind * step_time if math.isfinite(step_time) else math.nan
            if job.groups.additive:
                how = f"{behind:.0%} of a step ({late:.3f} s of {step_time:.3f} s) behind {peers}"
            else:
                how = f"its steps take {behind:.0%} longer than {'its own normal' if ahead < 0 else peers}"
            stage = state.worse.follow(1.0 + behind, now, STAGES.bar(), STAGES.hold)
            again = f"; it grew materially worse {stage} time(s) while its alert was open" if stage else ""
            out.append(
                Finding(
                    STRAGGLER,
                    entity,
                    f"Rank {rank} of job {job_name}{where} is a straggler: {how}, sustained{again}",
                    value=behind,
                    stage=stage,
                    details={
                        "behind_share": behind,
                        "lag_share": now_lag,
                        "lag_seconds": late,
                        "smoothed_lag_share": state.lag,
                        "own_baseline": state.lag_base,
                        "step_seconds": step_time,
                        "speed_group": group,
                    },
                )
            )
        if state.skew_hits >= self.sustain:
            ratio = math.exp(state.skew)
            out.append(
                Finding(
                    SKEW,
                    entity,
                    f"Gradient norm of rank {rank} of job {job_name}{where} is {ratio:.2f}x the peer median",
                    value=ratio,
                    details={"ratio_to_peers": ratio},
                )
            )
        if state.frag_hits >= self.sustain:
            rise, retries = self._frag_rise(state), self._new_retries(state)
            out.append(
                Finding(
                    FRAG,
                    entity,
                    f"Allocator of rank {rank} of job {job_name}{where}: fragmentation {state.frag:.0%} "
                    f"({rise:+.0%} since start), {retries:.0f} allocator retries in the last "
                    f"{self.retry_window:.0f} s: OOM risk",
                    value=state.frag,
                    details={"fragmentation": state.frag, "rise": rise, "recent_retries": retries},
                )
            )
        return out


def _median(values: Iterable[float]) -> float:
    """Median of finite values, bit for bit what ``np.median`` gives, without its per-call cost
    (a few microseconds, paid per rank per step)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out: list[str] = []
    for r in ranks:
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)
