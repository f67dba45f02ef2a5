"""One rank against its peers: ``training_straggler``, ``gradient_skew``, ``memory_fragmentation``.

Per closed step every rank gets a *lag*: how late it arrived at the collective beyond the peer
reference (``collective_arrival_skew_seconds``, as a share of the step time) or, when ranks report
their own step times instead, how much longer its step took than the reference. The reference is
the ``ref_quantile`` quantile of the ranks, not their median, so it stays with the healthy ranks
when up to three quarters of them slow down together (a shared switch, a bad rack). A rank's lag
is the median of its last ``window`` lags: a one-step data-loader hiccup is not a straggler, and
a straggler that gets worse shows it (no clipping). A straggler's lag is at least ``lag`` *and*
``excess`` (or ``noise_k`` times its own healthy spread, if larger) above its own normal lag,
learned while it is not slow (at most up to ``normal_cap``),
so ranks that are always a little slower (fixed offsets on shared hardware) stay quiet, while a
rank that was slow from its first step still stands out.

Gradient skew: a rank's smoothed log-ratio of gradient norm to the peer median beyond
``log(skew_ratio)``. Fragmentation: a rank's allocator fragmentation ``frag_rise`` above its own
early level, or allocator retries climbing. Verdicts need ``sustain`` steps in a row.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import StepDetector, register
from gpuscope.detect.jobs import place_text
from gpuscope.detect.steps import StepView
from gpuscope.model import Event, Finding, FloatArray

STRAGGLER, SKEW, FRAG = "training_straggler", "gradient_skew", "memory_fragmentation"


@dataclass(slots=True)
class _Rank:
    lag: float = math.nan
    lags: deque[float] = field(default_factory=deque)  # the last ``window`` lags
    lag_base: float = math.nan
    lag_spread: float = 0.0  # mean absolute deviation of its raw lags from their median, while healthy
    lag_n: int = 0
    lag_hits: int = 0
    recent: list[float] = field(default_factory=list)  # the last few unsmoothed lags: what is said
    skew: float = math.nan
    skew_hits: int = 0
    frag0: list[float] = field(default_factory=list)
    frag_base: float = math.nan  # median of the first values, once there are enough
    frag: float = math.nan
    retries: list[tuple[float, float]] = field(default_factory=list)  # (ts, total), last few minutes
    frag_hits: int = 0
    arrival: float = math.nan
    seen: float = -math.inf


@dataclass(slots=True)
class _Job:
    ranks: dict[int, _Rank] = field(default_factory=dict)
    step_time: float = math.nan


@register
class RankDetector(StepDetector):
    rules = (STRAGGLER, SKEW, FRAG)

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
        warm_steps: int = 20,
    ) -> None:
        self.window, self.base_alpha, self.lag, self.excess = window, base_alpha, lag, excess
        self.ref_quantile, self.noise_k = ref_quantile, noise_k
        self.normal_cap = normal_cap
        self.skew_log = math.log(skew_ratio)
        self.frag_rise, self.retry_window, self.min_retries = frag_rise, retry_window, min_retries
        self.sustain, self.warm_steps = sustain, warm_steps
        super().__init__()
        self._jobs: dict[str, _Job] = {}

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
                out.extend(self._findings(name, job, rank, state))
        return out

    def step(self, view: StepView) -> None:
        job = self._jobs.get(view.job)
        if job is None or view.rollback:
            job = self._jobs[view.job] = _Job()
        ranks = [
            job.ranks.get(r) or job.ranks.setdefault(r, _Rank(lags=deque(maxlen=self.window)))
            for r in view.ranks
        ]
        for state in ranks:
            state.seen = view.ts
        step = view.get("step_seconds")
        finite = step[np.isfinite(step)]
        if finite.size:
            job.step_time = float(np.median(finite))
        if len(ranks) >= 3:
            self._lags(job, view, ranks, step)
            self._skew(view, ranks)
        self._frag(view, ranks)

    def _lags(self, job: _Job, view: StepView, ranks: list[_Rank], step: FloatArray) -> None:
        arrival = view.get("collective_arrival_skew_seconds")
        if np.isfinite(arrival).sum() < 3:  # the SDK reports each rank's own gap; the median is the same
            arrival = view.get("collective_arrival_gap_seconds")
        if np.isfinite(arrival).sum() >= 3 and job.step_time > 0:
            lags = (arrival - np.nanquantile(arrival, self.ref_quantile)) / job.step_time
        elif np.isfinite(step).sum() >= 3:
            lags = step / np.nanquantile(step, self.ref_quantile) - 1.0
        else:
            return
        for state, x, arrived in zip(ranks, lags.tolist(), arrival.tolist(), strict=True):
            if not math.isfinite(x):
                continue
            state.arrival = arrived
            state.recent.append(x)
            del state.recent[: -self.sustain]
            state.lags.append(x)
            state.lag = float(np.median(state.lags))
            state.lag_n += 1
            if state.lag_hits == 0:  # the normal is learned while the rank is not judged slow
                # a running mean at first, so the normal does not hang on the first sample
                alpha = max(self.base_alpha, 1.0 / state.lag_n)
                learn = min(state.lag, self.normal_cap)
                base = state.lag_base if math.isfinite(state.lag_base) else learn
                state.lag_base = base + alpha * (learn - base)
                # a data-loader hiccup is an outlier, not the spread of the rank's pace
                state.lag_spread += alpha * (min(abs(x - state.lag), 0.1) - state.lag_spread)
            # noisy ranks (real data loaders, shared hosts) must stand out of their own noise
            excess = max(self.excess, self.noise_k * state.lag_spread)
            slow = (
                state.lag_n >= self.warm_steps
                and state.lag >= self.lag
                and state.lag - state.lag_base >= excess
            )
            state.lag_hits = state.lag_hits + 1 if slow else 0

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
                        state.frag_base = float(np.median(state.frag0))
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

    def _findings(self, job_name: str, job: _Job, rank: int, state: _Rank) -> list[Finding]:
        out: list[Finding] = []
        entity = {"job": job_name, "rank": str(rank), **self.steps.where(job_name, rank)}
        where = f" on {place_text(entity['node'], entity.get('gpu', ''))}" if "node" in entity else ""
        if state.lag_hits >= self.sustain:
            # the smoothed lag decides; the recent lags say how far behind it is now (the smoothed
            # one still trails a lag that began mid-run)
            now_lag = float(np.median(state.recent)) if state.recent else state.lag
            late = now_lag * job.step_time if math.isfinite(job.step_time) else math.nan
            out.append(
                Finding(
                    STRAGGLER,
                    entity,
                    f"Rank {rank} of job {job_name}{where} is a straggler: {now_lag:.0%} of a step "
                    f"({late:.3f} s of {job.step_time:.3f} s) behind the peer median, sustained",
                    value=now_lag,
                    details={
                        "lag_share": now_lag,
                        "lag_seconds": late,
                        "smoothed_lag_share": state.lag,
                        "own_baseline": state.lag_base,
                        "step_seconds": job.step_time,
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
