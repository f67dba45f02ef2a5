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
  times its reference;
* ``inference_error_rate``: multi-window burn rate of an error budget (``slo``), or of the
  service's own usual error ratio where that is higher (an EWMA over ``error_tau``, seeded by its
  first reports: a service that always runs at its error level is not burning anything new): both
  the 30 s and 5 min windows burn ``fast_burn`` times faster than allowed, or the 5 min and 1 h ``slow_burn``;
* ``inference_queue_buildup``: the queue far above its usual depth at this time of day (at least
  ``min_queue``), for ``queue_sustain`` seconds;
* ``kv_cache_pressure``: against the service's own operating point: the cache nearly full and
  ``kv_margin`` above its usual level, a sudden jump in its use, or preemptions ``preempt_ratio``
  times their usual rate (and at least ``min_preemptions`` a minute); a service that always runs
  near full with a few preemptions a minute stays quiet. The rule's tier (P3) is a cache beyond its
  operating point; when p95 latency or TTFT is at the same time ``kv_impact`` times its reference,
  users feel it and the alert is P2.

Each must hold for ``sustain`` seconds (the KV cache ``kv_sustain``: a busy cache brushes full);
the first ``warmup`` seconds of a service only learn.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from gpuscope.detect.base import ServiceDetector, register
from gpuscope.detect.services import Snapshot
from gpuscope.detect.vectors import SeasonalBaseline
from gpuscope.model import Finding

LATENCY, TTFT, ERRORS, QUEUE, KV = (
    "inference_latency_regression",
    "inference_ttft_regression",
    "inference_error_rate",
    "inference_queue_buildup",
    "kv_cache_pressure",
)


class _Ewma:
    __slots__ = ("mean", "tau")

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.mean = math.nan

    def push(self, value: float, dt: float) -> float:
        if math.isfinite(value):
            if not math.isfinite(self.mean):
                self.mean = value
            else:
                self.mean += (1.0 - math.exp(-dt / self.tau)) * (value - self.mean)
        return self.mean


class _DayShape:
    """A series' time-of-day baseline: each bucket's mean is learned once per day, at its end.

    It learns anomalies too, at ``alpha`` a day: a daily peak must be learnable from the first
    day, when it is still news, and a regression that lasts past a day is half learned by then.
    """

    __slots__ = ("_bucket", "_n", "_sum", "season")

    def __init__(self, buckets: int, alpha: float) -> None:
        self.season = SeasonalBaseline(buckets=buckets, alpha=alpha, min_count=1)
        self._bucket = -1
        self._sum = self._n = 0.0

    def push(self, ts: float, value: float) -> None:
        bucket = int(ts // (self.season.period / self.season.buckets))
        if bucket != self._bucket:
            if self._n > 0:
                # the bucket's middle: the mean stands for the whole of it
                middle = (self._bucket + 0.5) * self.season.period / self.season.buckets
                self.season.push(middle, self._sum / self._n)
            self._bucket, self._sum, self._n = bucket, 0.0, 0.0
        if math.isfinite(value):
            self._sum += value
            self._n += 1

    def expected(self, ts: float) -> float:
        """The value usual at this time of day; NaN before this hour of the day was seen once."""
        return self.season.expected(ts) if self.season.known(ts) else math.nan


@dataclass(slots=True)
class _Rule:
    since: float | None = None
    firing: bool = False
    text: str = ""
    value: float = math.nan
    severity: str | None = None

    def hold(self, cond: bool, clear: bool, ts: float, sustain: float) -> None:
        if cond:
            self.since = self.since if self.since is not None else ts
        elif clear or not self.firing:
            self.since = None
        self.firing = self.since is not None and ts - self.since >= sustain


@dataclass(slots=True)
class _Svc:
    first: float
    last: float
    fast: dict[str, _Ewma] = field(default_factory=dict)
    slow: dict[str, _Ewma] = field(default_factory=dict)
    rules: dict[str, _Rule] = field(default_factory=dict)
    snap: Snapshot | None = None
    cum_ts: list[float] = field(default_factory=list)  # cumulative errors and requests, for true windows
    cum_err: list[float] = field(default_factory=list)
    cum_req: list[float] = field(default_factory=list)
    days: dict[str, _DayShape] = field(default_factory=dict)

    def window(self, seconds: float) -> tuple[float, float]:
        """Errors and requests over the last ``seconds`` (sliding, not exponential: a burst leaves it)."""
        if not self.cum_ts:
            return 0.0, 0.0
        i = bisect.bisect_left(self.cum_ts, self.cum_ts[-1] - seconds)
        return self.cum_err[-1] - self.cum_err[i], self.cum_req[-1] - self.cum_req[i]

    def count(self, ts: float, errors: float, requests: float, dt: float) -> None:
        e = (self.cum_err[-1] if self.cum_err else 0.0) + (errors * dt if math.isfinite(errors) else 0.0)
        r = (self.cum_req[-1] if self.cum_req else 0.0) + (requests * dt if math.isfinite(requests) else 0.0)
        self.cum_ts.append(ts)
        self.cum_err.append(e)
        self.cum_req.append(r)
        if len(self.cum_ts) > 8192 and ts - self.cum_ts[0] > 3700.0:
            cut = bisect.bisect_left(self.cum_ts, ts - 3700.0)
            del self.cum_ts[:cut], self.cum_err[:cut], self.cum_req[:cut]

    def ewma(self, name: str, tau: float, value: float, dt: float, frozen: bool = False) -> float:
        store = self.fast if tau < 200 else self.slow
        key = f"{name}:{tau:g}"
        e = store.get(key)
        if e is None:
            e = store[key] = _Ewma(tau)
        return e.mean if frozen and math.isfinite(e.mean) else e.push(value, dt)

    def reference(self, name: str, ts: float, value: float, base: float, buckets: int, alpha: float) -> float:
        """The operating point of a series: its long EWMA ``base``, or its usual level at this time
        of day where that is higher; learns ``value`` into the time-of-day baseline."""
        day = self.days.get(name)
        if day is None:
            day = self.days[name] = _DayShape(buckets, alpha)
        day.push(ts, value)
        usual = day.expected(ts)
        return max(base, usual) if math.isfinite(usual) and math.isfinite(base) else base

    def rule(self, name: str) -> _Rule:
        r = self.rules.get(name)
        if r is None:
            r = self.rules[name] = _Rule()
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
        warmup: float = 300.0,
        season_bucket: float = 1800.0,
        season_alpha: float = 0.5,
    ) -> None:
        self.tau, self.base_tau, self.ratio, self.ttft_ratio = tau, base_tau, ratio, ttft_ratio
        self.budget = 1.0 - slo
        self.fast_burn, self.slow_burn, self.error_tau = fast_burn, slow_burn, error_tau
        self.min_queue, self.kv_full, self.kv_jump = min_queue, kv_full, kv_jump
        self.kv_margin, self.min_preemptions, self.preempt_ratio = kv_margin, min_preemptions, preempt_ratio
        self.sustain, self.warmup, self.kv_sustain = sustain, warmup, kv_sustain
        self.queue_sustain, self.kv_impact = queue_sustain, kv_impact
        self.buckets, self.season_alpha = max(1, round(86400.0 / season_bucket)), season_alpha
        super().__init__()
        self._svcs: dict[str, _Svc] = {}

    def judge(self, now: float, snapshots: dict[str, Snapshot]) -> list[Finding]:
        """Fold in the services' new snapshots; the findings that hold at ``now``."""
        for name, snap in snapshots.items():
            svc = self._svcs.get(name)
            if svc is None:
                svc = self._svcs[name] = _Svc(snap.ts, snap.ts)
            dt = min(max(snap.ts - svc.last, 0.0), 10.0)
            svc.last = snap.ts
            svc.snap = snap
            self._judge(svc, snap, dt)
        out: list[Finding] = []
        for name, svc in self._svcs.items():
            if svc.snap is None or now - svc.last > 30.0:
                continue
            for rule, state in svc.rules.items():
                if state.firing:
                    out.append(self._finding(name, svc.snap, rule, state))
        return out

    def _judge(self, svc: _Svc, s: Snapshot, dt: float) -> None:
        warm = s.ts - svc.first >= self.warmup
        self._ratio_rule(svc, s, dt, LATENCY, f"{s.latency_stat} latency", s.p95, self.ratio, warm)
        self._ratio_rule(svc, s, dt, TTFT, "time to first token (p95)", s.ttft, self.ttft_ratio, warm)
        self._errors(svc, s, dt, warm)
        self._queue(svc, s, dt, warm)
        self._kv(svc, s, dt, warm)

    def _ratio_rule(
        self, svc: _Svc, s: Snapshot, dt: float, rule: str, what: str, value: float, ratio: float, warm: bool
    ) -> None:
        state = svc.rule(rule)
        short = svc.ewma(rule, self.tau, value, dt)
        holding = state.since is not None
        base = svc.ewma(rule, self.base_tau, value, dt, frozen=holding)
        base = svc.reference(rule, s.ts, value, base, self.buckets, self.season_alpha)
        r = short / base if base > 0 else math.nan
        state.hold(warm and r >= ratio, r < 1.0 + 0.5 * (ratio - 1.0), s.ts, self.sustain)
        state.value = r
        state.text = f"{what} at {short:.3g} s, {r:.1f}x its baseline of {base:.3g} s"

    def _errors(self, svc: _Svc, s: Snapshot, dt: float, warm: bool) -> None:
        state = svc.rule(ERRORS)
        svc.count(s.ts, s.errors, s.requests, dt)
        ratio = s.errors / s.requests if s.requests > 0 and math.isfinite(s.errors) else math.nan
        usual = svc.ewma("error_ratio", self.error_tau, ratio, dt, frozen=state.since is not None)
        # the service's own operating point, where it is above the SLO's budget
        budget = max(self.budget, usual) if math.isfinite(usual) and warm else self.budget
        burns = {}
        for seconds in (30.0, 300.0, 3600.0):
            err, req = svc.window(seconds)
            burns[seconds] = err / max(req, err, 1e-9) / budget
        enough = svc.window(300.0)[0] >= 10.0
        fast = burns[30.0] >= self.fast_burn and burns[300.0] >= self.fast_burn
        slow = burns[300.0] >= self.slow_burn and burns[3600.0] >= self.slow_burn
        state.hold(enough and (fast or slow), burns[300.0] < 1.0, s.ts, 0.0)
        state.value = burns[300.0]
        state.text = (
            f"errors burn the {budget:.1%} error budget {burns[300.0]:.1f}x too fast over 5 min "
            f"({burns[30.0]:.1f}x over 30 s, {burns[3600.0]:.1f}x over 1 h)"
        )

    def _queue(self, svc: _Svc, s: Snapshot, dt: float, warm: bool) -> None:
        state = svc.rule(QUEUE)
        short = svc.ewma("queue", 10.0, s.queue, dt)
        holding = state.since is not None
        base = svc.ewma("queue", self.base_tau, s.queue, dt, frozen=holding)
        base = svc.reference("queue", s.ts, s.queue, base, self.buckets, self.season_alpha)
        limit = max(self.min_queue, 4.0 * base)
        state.hold(warm and short >= limit, short < 0.5 * limit, s.ts, self.queue_sustain)
        state.value = short
        state.text = f"{short:.0f} requests queued (usually {base:.1f})"

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
        state.hold(cond, clear, s.ts, self.kv_sustain)
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
        )
