"""Inference services on rolling baselines: latency, time to first token, error budget, queue, KV cache.

Per service snapshot (:mod:`~gpuscope.detect.services`), short EWMAs (``tau`` seconds) are
compared with the service's own operating point: a long EWMA (``base_tau``) and, where the load
has a daily shape, a time-of-day baseline (:class:`~gpuscope.detect.vectors.SeasonalBaseline`,
one value per ``season_bucket`` of the day, learned once per bucket from its mean, at
``season_alpha`` a day). The reference is the larger of the two once that hour of the day has been
seen: a daily peak is expected at peak time, while the same level at a normally quiet hour stands
out against the long EWMA. The long EWMA freezes while the rule is pending or firing, so a
regression is not learned as normal within the day.

* ``inference_latency_regression`` / ``inference_ttft_regression``: p95 latency / TTFT ``ratio``
  times its reference, judged on the lower of the short EWMA and the median of the series over
  ``tau``, or over ``min_updates`` of its own update intervals where that is longer (the usual
  time between changes of its value: a value held by the scrapes until the next update is one
  sample); the reference is the long EWMA of that median. Where the series is
  noisier than ``ratio`` allows (its median's mean absolute log deviation from the reference,
  over ``noise_tau``, learned while the rule is quiet), the limit is ``noise_z`` times that
  deviation instead; and the condition must hold for ``hold_updates`` of the series' own update
  intervals as well as ``sustain``: a service that updates its latency once a minute is judged on
  minutes, not on copies of one sample. A slower tier of the same rules finds a smaller sustained
  step (``step_ratio``, 1.15x: the median of the last two minutes against the operating point from
  before them, held a minute) where the series' own sustained shifts while healthy are well below
  it, its demand did not rise with it, and it updates often enough (see :meth:`ServingDetector._step`);
* ``inference_error_rate``: multi-window burn rate of an error budget (``slo``), or of the
  service's own usual error ratio where that is higher (an EWMA over ``error_tau``, seeded by its
  first reports, or its level at this time of day where that is higher: a service that always
  runs at its error level, or sheds some requests at every rush, is not burning anything new): both
  the 30 s and 5 min windows burn ``fast_burn`` times faster than allowed, or the 5 min and 1 h ``slow_burn``;
* ``inference_queue_buildup``: the queue far above its usual depth at this time of day (at least
  ``min_queue``), for ``queue_sustain`` seconds;
* ``kv_cache_pressure``: against the service's own operating point: the cache nearly full and
  ``kv_margin`` above its usual level, a sudden jump in its use, or preemptions ``preempt_ratio``
  times their usual rate (and at least ``min_preemptions`` a minute); a service that always runs
  near full with a few preemptions a minute stays quiet. The rule's tier (P3) is a cache beyond its
  operating point; when p95 latency or TTFT is at the same time ``kv_impact`` times its reference,
  users feel it and the alert is P2.

A young service (one whose latency/TTFT baseline has learned, while its rule was quiet, less than
``peer_young`` seconds or ``peer_young_updates`` of its own update intervals) is also held to its
established peers: the other services serving the same model and version that are past their
own youth and quiet on that rule. Their operating point is the median of their references, their
spread the larger of their median noise and how far their references stray from that median;
the young service's latency/TTFT beyond that limit fires (after its warm-up) and is not learned
into its own baseline, so a service sick from its first report is found, and its sickness does
not become its normal. Once its own baseline is learned it hands over to it. Without such peers
the rules are as for any service.

Each must hold for ``sustain`` seconds (the KV cache ``kv_sustain``: a busy cache brushes full);
the first ``warmup`` seconds of a service only learn. Every EWMA is, younger than its time
constant, the mean of all it has seen, so a young service has a usable baseline after its first
minute. Three things keep a service's normal operation quiet at its daily peak:

* the time-of-day band: per bucket, the level and how high the series normally reaches (its 99th
  percentile over the bucket, learned only from samples its rule did not fire or wait on); once
  that time of day was seen, latency, TTFT and queue must also exceed ``band`` times the top of
  the band (of the bucket and its neighbours);
* bursts of the service's own demand: a queue episode in which the service served ``surge`` times
  its usual rate is its demand meeting its capacity (a capacity loss serves less). A condition
  pending mostly through such saturation must outlast ``burst_factor`` times the service's normal
  burst (the 90th percentile of its last saturated episodes; ``burst_default`` before three were
  seen), at most ``burst_longest``: a longer overload fires;
* hysteresis: a firing rule resolves only once its clear condition held ``clear_hold`` seconds,
  and each re-fire within an hour after the first waits twice as long.
* stages: a latency/TTFT rule with a stage bar (:attr:`gpuscope.rules.RuleSpec.stages`) that fires
  and grows materially worse, its recent median that bar above the one its alert last told for the
  bar's hold, the bar measured on the series' own noise as learned before the alert, is told again
  (:mod:`gpuscope.detect.worsening`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from gpuscope.detect.base import ServiceDetector, register
from gpuscope.detect.services import Snapshot
from gpuscope.detect.vectors import SeasonalBaseline
from gpuscope.detect.worsening import Worsening
from gpuscope.model import Finding
from gpuscope.rules import RULES

LATENCY, TTFT, ERRORS, QUEUE, KV = (
    "inference_latency_regression",
    "inference_ttft_regression",
    "inference_error_rate",
    "inference_queue_buildup",
    "kv_cache_pressure",
)


def _median(values: list[float]) -> float:
    """``np.median`` of a few hundred finite values at most, to the bit: sorting them in Python
    costs a fifth of numpy's call, and the recent windows are taken for every series each second."""
    values.sort()
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2


class _Ewma:
    """An exponential mean over ``tau`` seconds that, younger than ``tau``, is the mean of all it
    has seen (bias-corrected: its weights are renormalised over the time seen). Seeded by its
    first value instead, a long baseline stays near one sample for many minutes, so a young
    service could not be judged; as the plain mean of its first minutes it can be after a few
    ``tau`` of the short means that are compared with it."""

    __slots__ = ("mean", "tau", "weight")

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.mean = math.nan
        self.weight = 0.0

    def push(self, value: float, dt: float) -> float:
        if math.isfinite(value):
            if not math.isfinite(self.mean):
                self.mean, self.weight = value, 1.0 - math.exp(-max(dt, 1.0) / self.tau)
            else:
                gain = 1.0 - math.exp(-dt / self.tau)
                self.weight += gain * (1.0 - self.weight)
                self.mean += gain / max(self.weight, 1e-12) * (value - self.mean)
        return self.mean


class _Extreme:
    """The largest (or, ``lowest``, the smallest) value pushed within the last ``seconds``: a
    monotonic deque, so each push is amortised O(1) however long the window."""

    __slots__ = ("_q", "lowest", "seconds")

    def __init__(self, seconds: float, lowest: bool = False) -> None:
        self.seconds, self.lowest = seconds, lowest
        self._q: deque[tuple[float, float]] = deque()

    def push(self, ts: float, value: float) -> None:
        if math.isfinite(value):
            sign = -1.0 if self.lowest else 1.0
            while self._q and sign * self._q[-1][1] <= sign * value:
                self._q.pop()
            self._q.append((ts, value))
        while self._q and self._q[0][0] < ts - self.seconds:
            self._q.popleft()

    @property
    def value(self) -> float:
        return self._q[0][1] if self._q else math.nan


class _DayShape:
    """A series' time-of-day band: each bucket's level (mean) and spread (its ``HIGH`` quantile)
    are learned once per day, at the bucket's end.

    It learns anomalies into the level too, at ``alpha`` a day: a daily peak must be learnable from
    the first day, when it is still news, and a regression that lasts past a day is half learned by
    then. The spread learns only the samples its rule did not fire on: it is the height of the
    service's normal bursts at that time of day, not of its faults.
    """

    __slots__ = ("_bucket", "_n", "_sum", "_values", "high", "season")

    HIGH = 0.99

    def __init__(self, buckets: int, alpha: float) -> None:
        self.season = SeasonalBaseline(buckets=buckets, alpha=alpha, min_count=1)
        self.high = SeasonalBaseline(buckets=buckets, alpha=alpha, min_count=1)
        self._bucket = -1
        self._sum = self._n = 0.0
        self._values: list[float] = []

    def push(self, ts: float, value: float, healthy: bool = True) -> None:
        width = self.season.period / self.season.buckets
        bucket = int(ts // width)
        if bucket != self._bucket:
            # the bucket's middle: the mean stands for the whole of it
            middle = (self._bucket + 0.5) * width
            if self._n > 0:
                self.season.push(middle, self._sum / self._n)
            if self._values:
                self.high.push(middle, float(np.quantile(self._values, self.HIGH)))
            self._bucket, self._sum, self._n = bucket, 0.0, 0.0
            self._values = []
        if math.isfinite(value):
            self._sum += value
            self._n += 1
            if healthy:
                self._values.append(value)

    def expected(self, ts: float) -> float:
        """The value usual at this time of day; NaN before this hour of the day was seen once."""
        return self.season.expected(ts) if self.season.known(ts) else math.nan

    def envelope(self, ts: float) -> float:
        """How high the series normally reaches around this time of day: the highest spread of this
        bucket and its two neighbours (a burst does not keep to a half-hour; one day is a thin
        sample); NaN before this bucket was seen on an earlier day."""
        if not self.high.known(ts):
            return math.nan  # this time of day not seen yet (the bucket under way is not learned)
        width = self.season.period / self.season.buckets
        return max(self.high.expected(t) for t in (ts - width, ts, ts + width) if self.high.known(t))


@dataclass(slots=True)
class _Rule:
    since: float | None = None
    firing: bool = False
    text: str = ""
    value: float = math.nan
    severity: str | None = None
    clear_since: float | None = None
    #: seconds of the pending time during which the service was saturated by its own demand
    loaded: float = 0.0
    seen: float = math.nan
    resolved: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    #: a young service's condition holds against its peers' limit alone (see ``_ratio_rule``)
    by_peers: bool = False
    #: while firing, a rule with stages: its stages of worsening and the growth that is one
    worse: Worsening = field(default_factory=Worsening)
    stage_bar: float = math.nan

    def hold(
        self,
        cond: bool,
        clear: bool,
        ts: float,
        need: float,
        clear_hold: float = 0.0,
        burst: tuple[bool, float] = (False, 0.0),
    ) -> None:
        """Pending while ``cond`` holds; firing once it held ``need`` seconds, doubled for each time
        the rule resolved within the last hour after the first: a condition that comes and goes
        fires again once at its own pace, then ever more slowly, not as a flap. ``burst`` is
        whether the service is saturated by its own demand now and how long its normal bursts
        last: a condition pending mostly through such saturation waits that long (its latency lags
        the queue, so it outlasts the saturation a little). A firing rule resolves once ``clear``
        held ``clear_hold`` seconds."""
        step = ts - self.seen if math.isfinite(self.seen) else 0.0
        self.seen = ts
        if self.firing:
            if cond or not clear:
                self.clear_since = None
                return
            self.clear_since = self.clear_since if self.clear_since is not None else ts
            if ts - self.clear_since >= clear_hold:
                self.firing, self.since, self.clear_since = False, None, None
                self.resolved.append(ts)
            return
        if not cond:
            self.since, self.loaded = None, 0.0
            return
        if self.since is None:
            self.since, self.loaded = ts, 0.0
        elif burst[0]:
            self.loaded += step
        held = ts - self.since
        if burst[0] or self.loaded >= 0.5 * held:
            need = max(need, burst[1])
        recent = sum(1 for t in self.resolved if ts - t < 3600.0)
        self.firing = held >= need * 2.0 ** max(0, recent - 1)


class _Lagged:
    """A value as it was ``lag`` seconds ago (the oldest kept, while younger): a step is measured
    against the reference from before the window judged, not against one that has meanwhile
    learned part of it."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[tuple[float, float]] = deque()

    def push(self, ts: float, value: float, lag: float) -> float:
        self._q.append((ts, value))
        while len(self._q) > 1 and self._q[1][0] <= ts - lag:
            self._q.popleft()
        return self._q[0][1]


@dataclass(slots=True)
class _Step:
    """The slower tier of a latency/TTFT rule (see ``ServingDetector._step``): its own hold state,
    the lowest excess over the hold (a sustained shift), the largest such sustained shift seen while
    the series was healthy, since when it learns, and when the fast tier last held."""

    rule: _Rule = field(default_factory=_Rule)
    held: _Extreme = field(default_factory=lambda: _Extreme(0.0, lowest=True))
    usual: _Extreme = field(default_factory=lambda: _Extreme(0.0))
    began: float = math.nan
    learned: float = math.nan
    busy: float = -math.inf
    #: the operating point and the demand as they were before the window and hold judged
    base: _Lagged = field(default_factory=_Lagged)
    demand: _Lagged = field(default_factory=_Lagged)
    #: sustained shifts not yet learned: (time, value), learned once a window and hold old
    fresh: deque[tuple[float, float]] = field(default_factory=deque)


@dataclass(slots=True)
class _Svc:
    first: float
    last: float
    fast: dict[str, _Ewma] = field(default_factory=dict)
    slow: dict[str, _Ewma] = field(default_factory=dict)
    rules: dict[str, _Rule] = field(default_factory=dict)
    #: per latency/TTFT rule, its slower tier: a smaller shift, held longer
    steps: dict[str, _Step] = field(default_factory=dict)
    snap: Snapshot | None = None
    cum_ts: list[float] = field(default_factory=list)  # cumulative errors and requests, for true windows
    cum_err: list[float] = field(default_factory=list)
    cum_req: list[float] = field(default_factory=list)
    cum_allowed: list[float] = field(default_factory=list)  # errors the budget in force allowed
    days: dict[str, _DayShape] = field(default_factory=dict)
    #: a queue episode under way: its start, the rate usual then, the requests served in it
    burst_since: float | None = None
    burst_last: float = math.nan
    burst_usual: float = math.nan
    burst_served: float = 0.0
    burst_time: float = 0.0
    #: the lengths of the service's last demand bursts: queue episodes its own load drove
    bursts: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    saturated: bool = False
    #: per series: its recent (time, value) reports, the times its value changed, its first report
    reports: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    changes: dict[str, deque[float]] = field(default_factory=dict)
    began: dict[str, float] = field(default_factory=dict)
    #: the model and version it serves (its peers serve the same)
    group: tuple[str, str] = ("", "")
    #: per latency/TTFT rule: seconds its own baseline learned while the rule was quiet
    learnt: dict[str, float] = field(default_factory=dict)
    #: per latency/TTFT rule, once established and while quiet: (time, reference, noise) for peers
    points: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def burst(
        self,
        ts: float,
        dt: float,
        building: bool,
        rate: float,
        usual: float,
        surge: float,
        gap: float,
        span: tuple[float, float],
    ) -> None:
        """Follow the queue's episodes (a dip shorter than ``gap`` seconds does not end one). One in
        which the service served ``surge`` times its usual rate (a surge of its own demand met its
        capacity; a capacity loss serves less) is a burst while it lasts (:attr:`saturated`); one
        that ended after lasting between the two seconds of ``span`` is one of the service's normal
        bursts (a shorter one could not have fired a rule; a longer one is not a burst)."""
        if self.burst_since is not None and not building and ts - self.burst_last >= gap:
            length = self.burst_last - self.burst_since
            if self.saturated and span[0] <= length < span[1]:
                self.bursts.append(length)
            self.burst_since, self.saturated = None, False
        if self.burst_since is None and not building:
            return
        if self.burst_since is None:
            self.burst_since, self.burst_usual, self.burst_served, self.burst_time = ts, usual, 0.0, 0.0
        if building:
            self.burst_last = ts
        if math.isfinite(rate):
            self.burst_served += rate * dt
            self.burst_time += dt
        mean = self.burst_served / self.burst_time if self.burst_time > 0 else rate
        self.saturated = self.burst_usual > 0 and mean >= surge * self.burst_usual

    def window(self, seconds: float) -> tuple[float, float, float]:
        """Errors, requests and the errors the budget then in force allowed, over the last
        ``seconds`` (sliding, not exponential: a burst leaves it)."""
        if not self.cum_ts:
            return 0.0, 0.0, 0.0
        i = bisect.bisect_left(self.cum_ts, self.cum_ts[-1] - seconds)
        return (
            self.cum_err[-1] - self.cum_err[i],
            self.cum_req[-1] - self.cum_req[i],
            self.cum_allowed[-1] - self.cum_allowed[i],
        )

    def count(self, ts: float, failed: float, served: float, budget: float) -> None:
        """Add the errors and requests of a snapshot to the windows, with the errors its budget
        allows."""
        e = (self.cum_err[-1] if self.cum_err else 0.0) + failed
        r = (self.cum_req[-1] if self.cum_req else 0.0) + served
        a = (self.cum_allowed[-1] if self.cum_allowed else 0.0) + budget * served
        self.cum_ts.append(ts)
        self.cum_err.append(e)
        self.cum_req.append(r)
        self.cum_allowed.append(a)
        if len(self.cum_ts) > 8192 and ts - self.cum_ts[0] > 3700.0:
            cut = bisect.bisect_left(self.cum_ts, ts - 3700.0)
            del self.cum_ts[:cut], self.cum_err[:cut], self.cum_req[:cut], self.cum_allowed[:cut]

    def recent(self, name: str, ts: float, value: float, seconds: float, count: int) -> float:
        """The median of the series over its recent window: ``seconds``, or ``count`` of its own
        update intervals where that is longer, and back to its ``count``-th last change of value
        (a value held by the scrapes until the next update is one sample, not many: the window
        must hold ``count`` of them)."""
        window = self.reports.get(name)
        if window is None:
            window = self.reports[name] = deque()
            self.changes[name] = deque(maxlen=16)
            self.began[name] = ts
        if math.isfinite(value):
            if not window or window[-1][1] != value:
                self.changes[name].append(ts)
            window.append((ts, value))
        start = ts - max(seconds, count * self.interval(name))
        changes = self.changes[name]
        if len(changes) >= count:
            # and its last ``count`` values, however old: after a silence the first new sample
            # is judged with the ones before it, not alone
            start = min(start, changes[-count])
        while len(window) > 1 and window[0][0] < start:
            window.popleft()
        return _median([v for _, v in window]) if window else math.nan

    def interval(self, name: str) -> float:
        """The series' usual time between changes of its value (0 until four were seen: a steady
        series is taken as updated at every report)."""
        changes = self.changes.get(name)
        if changes is None or len(changes) < 4:
            return 0.0
        return _median([b - a for a, b in pairwise(changes)])

    def filled(self, name: str, ts: float, seconds: float, count: int) -> bool:
        """Whether the series has been reporting for its whole window (see :meth:`recent`)."""
        began = self.began.get(name)
        return began is not None and ts - began >= max(seconds, count * self.interval(name))

    def ewma(self, name: str, tau: float, value: float, dt: float, frozen: bool = False) -> float:
        e = self.average(name, tau)
        return e.mean if frozen and math.isfinite(e.mean) else e.push(value, dt)

    def average(self, name: str, tau: float) -> _Ewma:
        store = self.fast if tau < 200 else self.slow
        key = f"{name}:{tau:g}"
        e = store.get(key)
        if e is None:
            e = store[key] = _Ewma(tau)
        return e

    def reference(
        self,
        name: str,
        ts: float,
        value: float,
        base: float,
        buckets: int,
        alpha: float,
        healthy: bool = True,
    ) -> tuple[float, float]:
        """The operating point of a series: its long EWMA ``base``, or its usual level at this time
        of day where that is higher, and how high it normally reaches at this time of day (NaN
        before that was seen); learns ``value`` into the time-of-day band (its spread only when
        ``healthy``)."""
        day = self.days.get(name)
        if day is None:
            day = self.days[name] = _DayShape(buckets, alpha)
        day.push(ts, value, healthy)
        usual = day.expected(ts)
        level = max(base, usual) if math.isfinite(usual) and math.isfinite(base) else base
        return level, day.envelope(ts)

    def normal(self, state: _Rule) -> bool:
        """Whether the latest sample shows the service's normal operation to its rule ``state``:
        neither firing nor pending, save a burst of its own demand."""
        return not state.firing and (state.since is None or self.saturated)

    def rule(self, name: str) -> _Rule:
        r = self.rules.get(name)
        if r is None:
            r = self.rules[name] = _Rule()
        return r

    def step(self, name: str) -> _Step:
        r = self.steps.get(name)
        if r is None:
            r = self.steps[name] = _Step()
        return r


@register
class ServingDetector(ServiceDetector):
    rules = (LATENCY, TTFT, ERRORS, QUEUE, KV)

    def __init__(
        self,
        tau: float = 20.0,
        base_tau: float = 900.0,
        ratio: float = 1.3,
        ttft_ratio: float = 1.4,
        slo: float = 0.995,
        fast_burn: float = 4.0,
        slow_burn: float = 2.0,
        error_tau: float = 21600.0,
        min_queue: float = 10.0,
        queue_sustain: float = 15.0,
        kv_full: float = 0.92,
        kv_jump: float = 0.3,
        kv_margin: float = 0.04,
        min_preemptions: float = 5.0,
        preempt_ratio: float = 3.0,
        sustain: float = 20.0,
        kv_sustain: float = 45.0,
        kv_impact: float = 1.2,
        warmup: float = 60.0,
        season_bucket: float = 1800.0,
        season_alpha: float = 0.5,
        band: float = 1.1,
        surge: float = 1.1,
        burst_factor: float = 3.0,
        burst_default: float = 240.0,
        burst_longest: float = 600.0,
        clear_hold: float = 30.0,
        min_updates: int = 5,
        noise_z: float = 3.0,
        noise_tau: float = 3600.0,
        hold_updates: float = 2.0,
        step_ratio: float = 1.15,
        step_tau: float = 120.0,
        step_updates: int = 10,
        step_hold: float = 60.0,
        step_hold_updates: float = 3.0,
        step_margin: float = 1.5,
        step_memory: float = 21600.0,
        step_learn: float = 300.0,
        step_learn_updates: int = 30,
        step_longest: float = 300.0,
        step_demand: float = 1.15,
        peer_young: float = 600.0,
        peer_young_updates: int = 20,
        peer_stale: float = 30.0,
    ) -> None:
        self.tau, self.base_tau, self.ratio, self.ttft_ratio = tau, base_tau, ratio, ttft_ratio
        self.budget = 1.0 - slo
        self.fast_burn, self.slow_burn, self.error_tau = fast_burn, slow_burn, error_tau
        self.min_queue, self.kv_full, self.kv_jump = min_queue, kv_full, kv_jump
        self.kv_margin, self.min_preemptions, self.preempt_ratio = kv_margin, min_preemptions, preempt_ratio
        self.sustain, self.warmup, self.kv_sustain = sustain, warmup, kv_sustain
        self.queue_sustain, self.kv_impact = queue_sustain, kv_impact
        self.buckets, self.season_alpha = max(1, round(86400.0 / season_bucket)), season_alpha
        self.band, self.surge, self.clear_hold = band, surge, clear_hold
        self.min_updates, self.noise_z, self.noise_tau = min_updates, noise_z, noise_tau
        self.hold_updates = hold_updates
        self.step_longest, self.step_demand = step_longest, step_demand
        self.step_ratio, self.step_tau, self.step_updates = step_ratio, step_tau, step_updates
        self.step_hold, self.step_hold_updates, self.step_margin = step_hold, step_hold_updates, step_margin
        self.step_memory, self.step_learn, self.step_learn_updates = (
            step_memory,
            step_learn,
            step_learn_updates,
        )
        self.burst_factor, self.burst_default, self.burst_longest = burst_factor, burst_default, burst_longest
        self.peer_young, self.peer_young_updates, self.peer_stale = peer_young, peer_young_updates, peer_stale
        super().__init__()
        self._svcs: dict[str, _Svc] = {}
        #: (model, version) -> the services serving it
        self._groups: dict[tuple[str, str], set[str]] = {}

    def judge(self, now: float, snapshots: dict[str, Snapshot]) -> list[Finding]:
        """Fold in the services' new snapshots; the findings that hold at ``now``."""
        for name, snap in snapshots.items():
            svc = self._svcs.get(name)
            if svc is None:
                svc = self._svcs[name] = _Svc(snap.ts, snap.ts)
            dt = min(max(snap.ts - svc.last, 0.0), 10.0)
            svc.last = snap.ts
            svc.snap = snap
            self._regroup(name, svc, (snap.model, snap.version))
            self._judge(name, svc, snap, dt)
        out: list[Finding] = []
        for name, svc in self._svcs.items():
            if svc.snap is None or now - svc.last > 30.0:
                continue
            for rule, state in svc.rules.items():
                step = svc.steps.get(rule)
                if state.firing:
                    out.append(self._finding(name, svc.snap, rule, state))
                elif step is not None and step.rule.firing:
                    out.append(self._finding(name, svc.snap, rule, step.rule))
        return out

    def _regroup(self, name: str, svc: _Svc, group: tuple[str, str]) -> None:
        if group == svc.group:
            return
        self._groups.get(svc.group, set()).discard(name)
        svc.group = group
        # a service that names no model has no peers: unrelated services would share the group
        if group[0]:
            self._groups.setdefault(group, set()).add(name)

    def _young(self, svc: _Svc, rule: str) -> bool:
        """Whether the rule's own baseline of the service is still being learned: it learned, while
        quiet, less than ``peer_young`` seconds or ``peer_young_updates`` of its update intervals."""
        need = max(self.peer_young, self.peer_young_updates * svc.interval(rule))
        return svc.learnt.get(rule, 0.0) < need

    def _peers(self, name: str, svc: _Svc, rule: str, ts: float) -> tuple[float, float, int] | None:
        """The operating point of the rule's series on the established services serving the same
        model and version as ``name`` (past their youth, quiet on the rule, reporting): the median
        of their references, their spread (the larger of their median noise and the median
        absolute log deviation of their references from that median) and how many they are; None
        without any."""
        points = [
            peer.points[rule]
            for other in self._groups.get(svc.group, ())
            if other != name
            and (peer := self._svcs.get(other)) is not None
            and rule in peer.points
            and ts - peer.points[rule][0] <= self.peer_stale
            and peer.points[rule][1] > 0
        ]
        if not points:
            return None
        refs = np.array([ref for _, ref, _ in points])
        middle = float(np.median(refs))
        noise = float(np.median([n if math.isfinite(n) else 0.0 for _, _, n in points]))
        stray = float(np.median(np.abs(np.log(refs / middle))))
        return middle, max(noise, stray), len(points)

    def learns_first(self) -> dict[str, float]:
        # the error budget burns against the SLO from the first report; the rest against the
        # service's own level, which its first ``warmup`` seconds learn
        return dict.fromkeys((LATENCY, TTFT, QUEUE, KV), self.warmup)

    def _judge(self, name: str, svc: _Svc, s: Snapshot, dt: float) -> None:
        warm = s.ts - svc.first >= self.warmup
        self._queue(svc, s, dt, warm)  # first: it tells whether the service is saturated by its demand
        self._ratio_rule(name, svc, s, dt, (LATENCY, f"{s.latency_stat} latency", s.p95), self.ratio, warm)
        self._ratio_rule(name, svc, s, dt, (TTFT, "time to first token (p95)", s.ttft), self.ttft_ratio, warm)
        self._errors(svc, s, dt, warm)
        self._kv(svc, s, dt, warm)

    def burst_wait(self, svc: _Svc) -> float:
        """How long a condition the service's own demand drives must hold to be more than one of
        its normal bursts: ``burst_factor`` times the 90th percentile of its last bursts (before
        three were seen, ``burst_default``), within ``sustain`` and ``burst_longest``."""
        if len(svc.bursts) < 3:
            return self.burst_default
        usual = float(np.quantile(np.fromiter(svc.bursts, float), 0.9))
        return min(self.burst_longest, max(self.sustain, self.burst_factor * usual))

    def _hold(self, svc: _Svc, state: _Rule, cond: bool, clear: bool, ts: float, need: float) -> None:
        state.hold(cond, clear, ts, need, self.clear_hold, (svc.saturated, self.burst_wait(svc)))

    def _ratio_rule(
        self,
        name: str,
        svc: _Svc,
        s: Snapshot,
        dt: float,
        series: tuple[str, str, float],
        ratio: float,
        warm: bool,
    ) -> None:
        rule, what, value = series
        state = svc.rule(rule)
        short = svc.ewma(rule, self.tau, value, dt)
        # the median of the series over at least its last few updates: one odd sample, repeated
        # by every scrape until the next update, is not a regression
        recent = svc.recent(rule, s.ts, value, self.tau, self.min_updates)
        step = svc.step(rule)
        holding = state.since is not None or step.rule.since is not None
        quiet = svc.normal(state) and svc.normal(step.rule)
        # the operating point of that median (of the raw values, a mix of light and heavy
        # requests would put the mean above what the median usually is)
        fresh = svc.filled(rule, s.ts, self.tau, self.min_updates)
        level = min(short, recent)
        # before the rule may judge (the warm-up), a level beyond the limit learned so far is not
        # learned either, as once it judges pending freezes the learning: a fault in a service's
        # first minute would otherwise be its operating point and its noise for many minutes
        learned = svc.average(rule, self.base_tau).mean, svc.average(f"{rule}:noise", self.noise_tau).mean
        beyond = not (warm and fresh) and level >= self._limits(*learned, ratio, math.nan)[0]
        # a young service is held to its established peers too, and a level beyond their limit is
        # not learned as its own normal (it may be sick from its first report)
        young = self._young(svc, rule)
        peers = self._peers(name, svc, rule, s.ts) if young else None
        peer_limit, peer_back = (
            self._limits(peers[0], peers[1], ratio, math.nan) if peers else (math.inf, math.inf)
        )
        beyond = beyond or level >= peer_limit
        quiet = quiet and not beyond
        if not (holding or beyond) and math.isfinite(recent):
            svc.learnt[rule] = svc.learnt.get(rule, 0.0) + dt
        base = svc.ewma(rule, self.base_tau, recent, dt, frozen=holding or beyond)
        base, high = svc.reference(rule, s.ts, short, base, self.buckets, self.season_alpha, quiet)
        # the series' own noise at this window: how far its recent median normally strays from
        # the baseline (mean absolute log deviation, learned while the rule is quiet)
        stray = abs(math.log(recent / base)) if recent > 0 and base > 0 else math.nan
        noise = svc.ewma(f"{rule}:noise", self.noise_tau, stray, dt, frozen=not quiet)
        limit, back = self._limits(base, noise, ratio, high)
        # a minimum duration in the series' own samples too: two fresh values past the first
        need = max(self.sustain, self.hold_updates * svc.interval(rule))
        cond = level >= limit or level >= peer_limit
        was = state.firing
        self._hold(svc, state, warm and fresh and cond, level < back and level < peer_back, s.ts, need)
        stages = RULES[rule].stages
        if stages is not None and state.firing:
            if not was:  # a new alert: the bar from the noise learned before it (frozen since)
                state.worse, state.stage_bar = Worsening(), stages.bar(noise)
            # the recent median: the short mean still trails a step when the rule fires, and a
            # level told low would make the rest of that step a stage
            state.worse.follow(recent, s.ts, state.stage_bar, stages.hold)
        # told against the peers while only their limit holds, and until the episode ends
        if cond:
            state.by_peers = peers is not None and not level >= limit
        elif state.since is None and not state.firing:
            state.by_peers = False
        if peers is not None and state.by_peers:
            r = short / peers[0]
            state.text = (
                f"{what} at {short:.3g} s, {r:.1f}x the {peers[0]:.3g} s of the {peers[2]} established "
                f"service(s) serving {s.model} {s.version} (this service is new: its own baseline "
                "is still being learned)"
            )
        else:
            r = short / base if base > 0 else math.nan
            state.text = f"{what} at {short:.3g} s, {r:.1f}x its baseline of {base:.3g} s" + (
                f" (normally up to {high:.3g} s at this hour)" if math.isfinite(high) else ""
            )
        state.value = r
        if state.worse.stage:
            state.text += f"; it grew materially worse {state.worse.stage} time(s) while its alert was open"
        if state.since is not None or state.firing:
            step.busy = s.ts
        idle = state.since is None and not state.firing and step.rule.since is None and not step.rule.firing
        if not young and idle and base > 0:
            svc.points[rule] = (s.ts, base, noise)
        else:
            svc.points.pop(rule, None)
        self._step(svc, s, dt, step, (rule, what, value), base, warm and quiet)

    def _limits(self, base: float, noise: float, ratio: float, high: float) -> tuple[float, float]:
        """A latency/TTFT rule's limit and clear level: above the operating point ``base`` by
        ``ratio``, or by the series' ``noise`` where that is wider, and above the top of its normal
        bursts at this hour (``high``); clear below half that margin."""
        spread = math.exp(self.noise_z * noise) if math.isfinite(noise) else 1.0
        limit = max(ratio, spread) * base
        limit = max(limit, self.band * high) if math.isfinite(high) else limit
        back = max(base * (1.0 + 0.5 * (max(ratio, spread) - 1.0)), high if math.isfinite(high) else 0.0)
        return limit, back

    def _step(
        self,
        svc: _Svc,
        s: Snapshot,
        dt: float,
        step: _Step,
        series: tuple[str, str, float],
        base: float,
        warm: bool,
    ) -> None:
        """The slower tier of a latency/TTFT rule (same rule name and tier): the series' median over
        ``step_tau`` (or ``step_updates`` of its own updates) ``step_ratio`` times its operating point
        as it was before that window, held ``step_hold`` (and ``step_hold_updates`` updates), and
        beyond ``step_margin`` times the largest sustained shift (the lowest excess over a hold)
        the series made while both tiers were quiet over the last ``step_memory`` seconds, after
        ``step_learn`` seconds (and ``step_learn_updates`` updates) of learning. Not judged: while
        the service's demand over the window is ``step_demand`` times its level before or a queue
        episode is under way (its own load), within a window and hold of the fast tier's last
        episode (a fault it judged is not found again from the longer median's memory), and on a
        series whose window of updates spans more than ``step_longest`` seconds."""
        rule, what, value = series
        key = f"{rule}:step"
        longer = svc.recent(key, s.ts, value, self.step_tau, self.step_updates)
        interval = svc.interval(key)
        window = max(self.step_tau, self.step_updates * interval)
        hold = max(self.step_hold, self.step_hold_updates * interval)
        base = step.base.push(s.ts, base, window + hold)
        # the service's demand over the window against its level before: latency that rose with
        # the service's own load is its queueing, not a regression (the fast tier and the queue
        # rule judge saturation)
        served = svc.recent(f"{key}:demand", s.ts, s.requests, self.step_tau, self.step_updates)
        usual_rate = svc.ewma(f"{key}:demand", self.base_tau, s.requests, dt)
        before = step.demand.push(s.ts, usual_rate, window + hold)
        busier = (served > self.step_demand * before if before > 0 else False) or svc.burst_since is not None
        excess = math.log(longer / base) if longer > 0 and base > 0 else math.nan
        step.held.seconds, step.usual.seconds = hold, self.step_memory
        step.held.push(s.ts, excess)
        if not math.isfinite(step.began):
            step.began = s.ts
        judged = s.ts - step.began >= window + hold  # the lowest excess spans a whole hold
        # learned a window and hold late, and not at all if the tier went pending meanwhile: the
        # first minutes of a step are not learned as the series' normal
        if step.rule.since is not None or step.rule.firing:
            step.fresh.clear()
        elif judged and warm and s.ts - step.busy >= window + hold:
            step.fresh.append((s.ts, step.held.value))
        while step.fresh and step.fresh[0][0] <= s.ts - (window + hold):
            t, shift = step.fresh.popleft()
            step.usual.push(t, shift)
            step.learned = step.learned if math.isfinite(step.learned) else t
        learn = max(self.step_learn, self.step_learn_updates * interval)
        learnt = (
            math.isfinite(step.learned) and s.ts - step.learned >= learn and math.isfinite(step.usual.value)
        )
        # judged on a step once its cadence is known (``step_updates`` changes seen) and its window
        # spans ``step_longest`` at most: at one update a minute, ten updates are ten minutes of a
        # wander that, on real series, moves further than a small step while healthy
        known = len(svc.changes.get(key, ())) >= self.step_updates and window <= self.step_longest
        armed = learnt and known
        usual = max(step.usual.value, 0.0) if armed else 0.0
        bar = max(math.log(self.step_ratio), self.step_margin * usual)
        clean = s.ts - step.busy >= window + hold
        cond = armed and clean and judged and not busier and excess >= bar
        self._hold(svc, step.rule, cond, not excess >= 0.5 * bar, s.ts, hold)
        r = longer / base if base > 0 else math.nan
        step.rule.value = r
        step.rule.text = (
            f"{what} at {longer:.3g} s over its last {window:.0f} s, {r:.2f}x its baseline of "
            f"{base:.3g} s for {hold:.0f} s (while healthy it held at most {math.exp(usual):.2f}x)"
        )

    def _errors(self, svc: _Svc, s: Snapshot, dt: float, warm: bool) -> None:
        state = svc.rule(ERRORS)
        # every row the snapshot newly counted, each once for its own interval (see
        # :mod:`~gpuscope.detect.services`); a snapshot made by hand stands for the time since the
        # last one
        if math.isfinite(s.served) and math.isfinite(s.failed) and math.isfinite(s.covered):
            served, failed, weight = s.served, s.failed, s.covered
            ratio = failed / served if served > 0 else math.nan
        else:
            served = s.requests * dt if math.isfinite(s.requests) else 0.0
            failed = s.errors * dt if math.isfinite(s.errors) else 0.0
            ratio = s.errors / s.requests if s.requests > 0 and math.isfinite(s.errors) else math.nan
            weight = dt
        usual = svc.ewma("error_ratio", self.error_tau, ratio, weight, frozen=state.since is not None)
        # its usual ratio at this time of day too: a service that sheds requests at every rush
        usual, _ = svc.reference("error_ratio", s.ts, ratio, usual, self.buckets, self.season_alpha)
        # the service's own operating point, where it is above the SLO's budget
        budget = max(self.budget, usual) if math.isfinite(usual) and warm else self.budget
        svc.count(s.ts, failed, served, budget)
        burns = {}
        for seconds in (30.0, 300.0, 3600.0):
            # against the budget in force over the window: the end of a rush does not make the
            # errors shed during it a burn
            err, req, allowed = svc.window(seconds)
            mean_budget = allowed / req if req > 0 else budget
            burns[seconds] = err / max(req, err, 1e-9) / mean_budget
        enough = svc.window(300.0)[0] >= 10.0
        fast = burns[30.0] >= self.fast_burn and burns[300.0] >= self.fast_burn
        slow = burns[300.0] >= self.slow_burn and burns[3600.0] >= self.slow_burn
        state.hold(enough and (fast or slow), burns[300.0] < 1.0, s.ts, 0.0, self.clear_hold)
        state.value = burns[300.0]
        state.text = (
            f"errors burn the {budget:.1%} error budget {burns[300.0]:.1f}x too fast over 5 min "
            f"({burns[30.0]:.1f}x over 30 s, {burns[3600.0]:.1f}x over 1 h)"
        )

    def _queue(self, svc: _Svc, s: Snapshot, dt: float, warm: bool) -> None:
        state = svc.rule(QUEUE)
        # the service's demand against its own level: a surge that builds the queue is a burst
        rate = svc.ewma("requests", self.tau, s.requests, dt)
        rate_base = svc.ewma("requests", self.base_tau, s.requests, dt)
        usual_rate, _ = svc.reference("requests", s.ts, rate, rate_base, self.buckets, self.season_alpha)
        short = svc.ewma("queue", 10.0, s.queue, dt)
        holding = state.since is not None
        base = svc.ewma("queue", self.base_tau, s.queue, dt, frozen=holding)
        base, high = svc.reference(
            "queue", s.ts, short, base, self.buckets, self.season_alpha, svc.normal(state)
        )
        normal = max(self.min_queue, 4.0 * base)
        building = short >= 0.5 * normal
        span = (self.sustain, self.burst_longest)
        svc.burst(s.ts, dt, building, s.requests, usual_rate, self.surge, self.clear_hold, span)
        limit = max(normal, self.band * high) if math.isfinite(high) else normal
        self._hold(svc, state, warm and short >= limit, short < 0.5 * limit, s.ts, self.queue_sustain)
        state.value = short
        state.text = f"{short:.0f} requests queued (usually {base:.1f})" + (
            f", normally up to {high:.0f} at this hour" if math.isfinite(high) else ""
        )

    def _kv(self, svc: _Svc, s: Snapshot, dt: float, warm: bool) -> None:
        state = svc.rule(KV)
        short = svc.ewma("kv", self.tau, s.kv, dt)
        base = svc.ewma("kv", self.base_tau, s.kv, dt, frozen=state.since is not None)
        rate = s.preempted / max(dt, 1e-9) * 60.0 if dt > 0 else math.nan
        preempt = svc.ewma("preempt", 60.0, rate, dt)
        usual = svc.ewma("preempt", self.base_tau, rate, dt, frozen=state.since is not None)
        # judged against the service's own operating point: a service that always runs its cache
        # near full with a few preemptions a minute is sized that way, not under pressure
        above = short - base
        full = short >= self.kv_full and above >= self.kv_margin
        jump = short >= 0.5 and above >= self.kv_jump
        limit = max(self.min_preemptions, self.preempt_ratio * usual + self.min_preemptions)
        preempting = preempt >= limit
        cond = warm and (full or jump or preempting)
        clear = not full and above < 0.5 * self.kv_jump and preempt < 0.5 * limit
        self._hold(svc, state, cond, clear, s.ts, self.kv_sustain)
        state.value = short
        # user impact: latency or TTFT beyond their own references while the cache is under pressure
        impact = max(
            (x for x in (svc.rule(LATENCY).value, svc.rule(TTFT).value) if math.isfinite(x)), default=1.0
        )
        felt = impact >= self.kv_impact
        state.severity = "P2" if felt else None
        state.text = (
            f"KV cache {short:.0%} full (usually {base:.0%}), {preempt:.0f} preemptions/min "
            f"(usually {usual:.0f})"
            + (f"; latency/TTFT {impact:.1f}x their baseline: users feel it" if felt else "")
        )

    def _finding(self, name: str, s: Snapshot, rule: str, state: _Rule) -> Finding:
        return Finding(
            rule,
            {"service": name},
            f"Service {name} ({s.model} {s.version}): {state.text}",
            value=state.value if math.isfinite(state.value) else None,
            details={"model": s.model, "version": s.version, "links": [{"node": n} for n in s.nodes]},
            severity=state.severity,
            stage=state.worse.stage,
        )
