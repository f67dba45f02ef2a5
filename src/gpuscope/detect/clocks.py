"""Clock trouble without heat: ``gpu_power_throttle`` (power cap or brake) and ``gpu_underperforming``
(clocks below the peers doing the same work, with no throttle reason to explain it).

Both judge a per-GPU condition sampled at each evaluation and smoothed into the share of the last
``tau`` seconds it held (an EWMA of a 0/1 flag): it fires at ``fire_share`` and clears below
``clear_share``, so one- or two-second power blips (normal under load) never reach it and a
recurring throttle does not flap. Vectorised over every GPU.

Peers are the loaded GPUs of the same job (attribution label), with the same robust reference as
training ranks (:mod:`gpuscope.detect.ranks`): the ``ref_quantile`` quantile of their SM clocks
(the fast end, not the median), so it stays with the healthy GPUs when up to three quarters of
them slow down together. For the first ``warm`` evaluations of a job its GPUs' paces (the
reference clock over their own) are only recorded; then the GPUs are clustered into speed groups
(:func:`~gpuscope.detect.vectors.speed_groups`: mixed clocks or parts from the start) and each
is judged within its own group. A group that was slower from the start is the job's placement,
not a live fault (training jobs report it as ``slow_placement``); a GPU alone in being slow from
the start is still underperforming. When GPUs join the job the groups are learned again, but a
GPU that is firing, or whose pace got worse since it was last learned, keeps its old group: a
live fault never becomes the new normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.base import GpuTableDetector, register
from gpuscope.detect.frames import BoolArray
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.vectors import IntArray, grow, speed_groups
from gpuscope.model import Finding, FloatArray

POWER, SLOW = "gpu_power_throttle", "gpu_underperforming"
SW_POWER, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
_METRICS = (
    "gpu_utilization_percent",
    "gpu_sm_clock_mhz",
    "gpu_clock_event_reasons",
    "gpu_throttle_sw_power",
    "gpu_throttle_hw_power_brake",
    "gpu_throttle_sw_thermal",
    "gpu_throttle_hw_thermal",
    "gpu_throttle_hw_slowdown",
    "gpu_power_watts",
    "gpu_power_limit_watts",
)


def _flag(table: GpuTable, metric: str) -> BoolArray:
    column = table.column(metric)
    flags: BoolArray = np.zeros(len(column), bool)
    np.greater(column, 0.5, out=flags)
    return flags


def _bits(table: GpuTable, mask: int) -> BoolArray:
    reasons = table.column("gpu_clock_event_reasons")
    known: BoolArray = np.isfinite(reasons)
    bits = np.where(known, reasons, 0.0).astype(np.int64) & mask
    known &= bits != 0
    return known


class _Share:
    """EWMA of a 0/1 condition per GPU, with fire/clear hysteresis."""

    def __init__(self, tau: float, fire: float, clear: float) -> None:
        self.tau, self.fire, self.clear = tau, fire, clear
        self.share: FloatArray = np.zeros(0)
        self.firing: BoolArray = np.zeros(0, bool)
        self.last: float | None = None

    def update(self, now: float, cond: BoolArray) -> BoolArray:
        n = len(cond)
        if len(self.share) < n:
            self.share = grow(self.share, n, 0.0)
            firing = np.zeros(len(self.share), bool)
            firing[: len(self.firing)] = self.firing
            self.firing = firing
        dt = 1.0 if self.last is None else min(max(now - self.last, 0.0), 5.0)
        self.last = now
        a = 1.0 - math.exp(-dt / self.tau)
        share = self.share[:n]
        share += a * (cond.astype(float) - share)
        firing = self.firing[:n]
        firing[:] = share >= np.where(firing, self.clear, self.fire)
        return firing


@dataclass(slots=True)
class _Peers:
    """One job's GPUs as peers: their speed groups and paces when last learned."""

    #: warm-up evaluations: (GPU ids, their lag behind the job's reference clock)
    warm: list[tuple[IntArray, FloatArray]] = field(default_factory=list)
    #: GPU id -> speed group (0: fastest); None until the first warm-up ends
    group: dict[int, int] | None = None
    #: GPU id -> its pace (lag behind the reference) when the groups were last learned
    pace: dict[int, float] = field(default_factory=dict)
    relearn: bool = False


@register
class ClockDetector(GpuTableDetector):
    rules = (POWER, SLOW)
    metrics = _METRICS

    def __init__(
        self,
        tau: float = 60.0,
        load_percent: float = 50.0,
        lag_ratio: float = 0.96,
        min_peers: int = 3,
        ref_quantile: float = 0.75,
        warm: int = 60,
        split_gap: float = 0.04,
        noise_k: float = 5.0,
    ) -> None:
        super().__init__()
        self.load_percent, self.lag_ratio, self.min_peers = load_percent, lag_ratio, min_peers
        self.ref_quantile, self.warm, self.split_gap, self.noise_k = ref_quantile, warm, split_gap, noise_k
        self._power = _Share(tau, 0.5, 0.25)
        self._slow = _Share(tau, 0.6, 0.3)
        self._ratio: FloatArray = np.zeros(0)
        self._peers: dict[int, _Peers] = {}
        #: per GPU id, its speed group (-1: not learned yet; a GPU that joined is judged once it is)
        self._gid: IntArray = np.zeros(0, np.intp)
        #: per GPU id, the job (code) it was a member of when last seen (-1: none)
        self._member: IntArray = np.zeros(0, np.intp)

    def evaluate(self, now: float) -> list[Finding]:
        t = self.table
        n = t.n
        if n == 0:
            return []
        recent = t.recent(now, 10.0)
        util = t.column("gpu_utilization_percent")
        loaded = recent & ~(util < self.load_percent)
        capped = _flag(t, "gpu_throttle_sw_power") | _bits(t, SW_POWER)
        brake = _flag(t, "gpu_throttle_hw_power_brake") | _bits(t, POWER_BRAKE)
        power = (capped | brake) & loaded
        thermal = (
            _flag(t, "gpu_throttle_sw_thermal")
            | _flag(t, "gpu_throttle_hw_thermal")
            | _bits(t, SW_THERMAL | HW_THERMAL)
        )
        hw = _flag(t, "gpu_throttle_hw_slowdown") | _bits(t, HW_SLOWDOWN)
        clock = np.where(loaded, t.column("gpu_sm_clock_mhz"), math.nan)
        peers, judged = self._references(clock, t.job[:n], recent)
        ratio = clock / peers
        self._ratio = ratio
        slow = judged & (ratio < self.lag_ratio) & ~power & ~thermal & ~hw
        out: list[Finding] = []
        for i in np.flatnonzero(self._power.update(now, power) & recent).tolist():
            out.append(self._power_finding(i, bool(brake[i])))
        for i in np.flatnonzero(self._slow.update(now, slow) & recent).tolist():
            out.append(self._slow_finding(i, float(ratio[i]), float(peers[i])))
        return out

    def _references(
        self, clock: FloatArray, job: IntArray, recent: BoolArray
    ) -> tuple[FloatArray, BoolArray]:
        """Per GPU, the reference clock of its speed group, and whether it can be judged yet."""
        n = len(clock)
        if len(self._gid) < n:
            size = max(n, 2 * len(self._gid), 16)
            self._gid = np.concatenate([self._gid, np.full(size - len(self._gid), -1, np.intp)])
            self._member = np.concatenate([self._member, np.full(size - len(self._member), -1, np.intp)])
        ref = np.full(n, math.nan)
        judged: BoolArray = np.zeros(n, bool)
        finite = np.isfinite(clock)
        for code in np.unique(job[(job >= 0) & recent]).tolist():
            mine = job == code
            joined = np.flatnonzero(mine & recent & (self._member[:n] != code))
            peers = self._peers.setdefault(code, _Peers())
            if joined.size:
                self._member[joined] = code
                self._gid[joined] = -1
                if peers.group is not None and not peers.relearn:
                    peers.relearn, peers.warm = True, []  # GPUs joined the job: learn its speeds again
            ids = np.flatnonzero(mine & finite)
            if len(ids) <= self.min_peers:
                continue
            if peers.group is None or peers.relearn:
                top = float(np.quantile(clock[ids], self.ref_quantile))
                peers.warm.append((ids, top / clock[ids] - 1.0))
                if len(peers.warm) >= self.warm:
                    self._split(peers, np.flatnonzero(self._member[:n] == code))
            if peers.group is None:
                continue
            groups = self._gid[ids]
            for g in np.unique(groups[groups >= 0]).tolist():
                own = ids[groups == g]
                pool = own if len(own) >= 2 else ids
                ref[own] = float(np.quantile(clock[pool], self.ref_quantile))
            # a GPU that joined is judged once the groups were learned with it
            judged[ids] = groups >= 0
        return ref, judged

    def _split(self, peers: _Peers, members: IntArray) -> None:
        """End of a warm-up: cluster the job's GPUs by pace; firing or worsened GPUs keep their group."""
        seen: dict[int, list[float]] = {}
        for ids, lags in peers.warm:
            for i, x in zip(ids.tolist(), lags.tolist(), strict=True):
                seen.setdefault(i, []).append(x)
        peers.warm = []
        paces = {i: float(np.median(xs)) for i, xs in seen.items()}
        noise = [float(np.median(np.abs(np.array(xs) - paces[i]))) for i, xs in seen.items()]
        gap = max(self.split_gap, self.noise_k * float(np.median(noise))) if noise else self.split_gap
        old, old_pace = peers.group or {}, peers.pace
        firing = self._slow.firing
        kept = {
            i
            for i, p in paces.items()
            if i in old and ((i < len(firing) and firing[i]) or p - old_pace[i] >= gap)
        }
        learn = {i: p for i, p in paces.items() if i not in kept}
        group = speed_groups(learn, gap) if len(learn) >= 4 else dict.fromkeys(learn, 0)
        group.update({i: old.get(i, 0) for i in kept})
        group.update({i: 0 for i in members.tolist() if i not in group})  # idle so far: the fast group
        peers.group = group
        self._gid[np.fromiter(group, np.intp, len(group))] = np.fromiter(group.values(), np.intp, len(group))
        peers.pace = {**old_pace, **learn}
        peers.relearn = False

    def _power_finding(self, i: int, brake: bool) -> Finding:
        node, gpu = self.table.keys[i]
        share = float(self._power.share[i])
        power = self.table.column("gpu_power_watts")[i]
        limit = self.table.column("gpu_power_limit_watts")[i]
        why = "the external power brake is engaged" if brake else "clocks are held down by the power cap"
        watts = (
            f" ({power:.0f} W of {limit:.0f} W allowed)"
            if math.isfinite(power) and math.isfinite(limit)
            else ""
        )
        return Finding(
            POWER,
            {"node": node, "gpu": gpu},
            f"{node} GPU {gpu}: {why}{watts} for {share:.0%} of the last minute under load",
            value=share,
            details={
                "throttled_share": share,
                "brake": brake,
                "power_watts": power if math.isfinite(power) else None,
            },
        )

    def _slow_finding(self, i: int, ratio: float, peers: float) -> Finding:
        node, gpu = self.table.keys[i]
        code = int(self.table.job[i])
        job = self.table.job_names[code] if code >= 0 else "?"
        known = self._peers.get(code)
        group = known.group.get(i, 0) if known is not None and known.group else 0
        clock = ratio * peers
        return Finding(
            SLOW,
            {"node": node, "gpu": gpu},
            f"{node} GPU {gpu} runs at {clock:.0f} MHz, {1 - ratio:.0%} below the other GPUs of job {job} "
            f"({peers:.0f} MHz) with no throttle reason",
            value=ratio if math.isfinite(ratio) else None,
            details={
                "clock_ratio_to_peers": ratio if math.isfinite(ratio) else None,
                "job": job,
                "speed_group": group,
            },
        )
