"""Clock trouble without heat: ``gpu_power_throttle`` (power cap or brake) and ``gpu_underperforming``
(clocks below the peers doing the same work, with no throttle reason to explain it).

Both judge a per-GPU condition sampled at each evaluation and smoothed into the share of the last
``tau`` seconds it held (an EWMA of a 0/1 flag): it fires at ``fire_share`` and clears below
``clear_share``, so one- or two-second power blips (normal under load) never reach it and a
recurring throttle does not flap. Vectorised over every GPU.

A power cap lowered well under what the node's other GPUs enforce (``gpu_power_limit_watts``, NVML
``nvmlDeviceGetEnforcedPowerLimit``, DCGM ``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``) is a power throttle
whatever the load: the GPUs of a node are one model with one default limit, so one GPU capped at
``cap_ratio`` of its node's highest limit or less was capped by someone or something, and its clocks
fall with the software power-cap reason as soon as its draw reaches the cap. On a GPU serving
inference at a light load, or idle, the draw may never reach it, so the reason alone would never say
so; a limit lowered on every GPU of a node alike (a deliberate fleet cap) is not judged.

A GPU with too few peers to be compared with (a service or job on one to ``min_peers`` GPUs, or a
GPU no job label names) is judged against the clock its part runs at: under load and with no clock
event reason at all, a GPU runs at its boost clock, so one ``alone_ratio`` or further below the
fastest such clock of its node's GPUs or of its own past is slow with nothing to explain it
(``gpu_underperforming``). Only at ``busy_percent`` or more: real captures show reason-free clocks
under the maximum (a T4 at 0 % at 585 of 1,590 MHz; an A100, its utilisation not given, at 1,275 of
1,410 MHz, within the bar; nvidia-smi -q captures in telegraf's tests). On a GPU serving inference
this is the only per-GPU sign: the service's latency mixes every replica's.

Peers are the loaded GPUs of the same job, judged within their speed group against its fast end
(:class:`~gpuscope.detect.peers.ClockPeers`, shared with ``gpu_failure_risk``): a group that was
slower from the start is the job's placement, not a live fault, and a GPU that is firing keeps
its group when the job's groups are learned again. Once a GPU's own pace against its group is
learned (:class:`~gpuscope.detect.gpupace.OwnPace`), its ratio is taken from that pace, so a part
that always runs a few per cent slower is no fault; ``gpu_underperforming`` then fires on either
path: the share of the last minute spent ``lag_ratio`` below the pace (large slowdowns, fast), or
the pace's evidence (small ones, 1.03-1.05x, over minutes). A GPU whose learned pace lags its
group's by more than the parts' spread from its start is reported once as a ``slow_placement`` of
that GPU (:class:`~gpuscope.detect.gpuplace.GpuPlacement`): the job runs at its pace, but it is no
live fault. A GPU that far behind from its start by the pace's bound (10 %) or more is a faulty part:
``gpu_underperforming`` from when its first readings give its pace, one alert with the later verdicts of the
same GPU, and no placement (one cause, one page, at the tier of a GPU that became that slow).
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.base import GpuTableDetector, register
from gpuscope.detect.frames import BoolArray
from gpuscope.detect.gpupace import OwnPace
from gpuscope.detect.gpuplace import GpuPlacement
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.peers import ClockPeers
from gpuscope.detect.vectors import group_count, group_max, grow
from gpuscope.model import Finding, FloatArray
from gpuscope.rules import GPU_POWER_THROTTLE as POWER
from gpuscope.rules import GPU_UNDERPERFORMING as SLOW
from gpuscope.rules import SLOW_PLACEMENT as PLACEMENT

SW_POWER, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
METRICS = (
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


@register
class ClockDetector(GpuTableDetector):
    rules = (POWER, SLOW, PLACEMENT)
    metrics = METRICS

    def __init__(
        self,
        tau: float = 60.0,
        load_percent: float = 50.0,
        lag_ratio: float = 0.96,
        cap_ratio: float = 0.85,
        busy_percent: float = 25.0,
        alone_ratio: float = 0.85,
        peers: ClockPeers | None = None,
        pace: OwnPace | None = None,
        placement: GpuPlacement | None = None,
    ) -> None:
        super().__init__()
        self.load_percent, self.lag_ratio, self.cap_ratio = load_percent, lag_ratio, cap_ratio
        self.busy_percent, self.alone_ratio = busy_percent, alone_ratio
        self._alone = _Share(tau, 0.6, 0.3)
        #: per GPU id, the fastest SM clock it has run at under load with no clock event reason
        self._best: FloatArray = np.zeros(0)
        self._alone_ref: FloatArray = np.zeros(0)
        self._power = _Share(tau, 0.5, 0.25)
        self._slow = _Share(tau, 0.6, 0.3)
        self._ratio: FloatArray = np.zeros(0)
        self._peers = peers if peers is not None else ClockPeers()
        self._pace = pace if pace is not None else OwnPace()
        self._placement = placement if placement is not None else GpuPlacement()
        self._held: BoolArray = np.zeros(0, bool)
        self._node_limit: FloatArray = np.zeros(0)
        self._lowered: BoolArray = np.zeros(0, bool)
        self._capped: BoolArray = np.zeros(0, bool)

    def _lowered_limits(self, recent: BoolArray) -> BoolArray:
        """Per GPU: its enforced power limit is at most ``cap_ratio`` of the highest one of its node's
        recent GPUs (each GPU's node reference kept in ``_node_limit`` for the summary)."""
        t = self.table
        node = t.node[: len(recent)]
        limit = t.column("gpu_power_limit_watts")
        known = recent & np.isfinite(limit)
        ref = group_max(limit, node, known, len(t.node_codes))[node]
        self._node_limit = ref
        lowered: BoolArray = known & (ref > 0) & (limit <= self.cap_ratio * ref)
        return lowered

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
        lowered = self._lowered_limits(recent)
        self._lowered, self._capped = lowered, capped & loaded
        power = ((capped | brake) & loaded) | lowered
        thermal = (
            _flag(t, "gpu_throttle_sw_thermal")
            | _flag(t, "gpu_throttle_hw_thermal")
            | _bits(t, SW_THERMAL | HW_THERMAL)
        )
        hw = _flag(t, "gpu_throttle_hw_slowdown") | _bits(t, HW_SLOWDOWN)
        alone = self._alone.update(now, self._alone_slow(recent, util, power | thermal | hw))
        clock = np.where(loaded, t.column("gpu_sm_clock_mhz"), math.nan)
        peers, judged = self._peers.references(clock, t.job[:n], recent, self._held)
        ratio = clock / peers
        self._ratio = ratio
        clean = judged & np.isfinite(ratio) & ~power & ~thermal & ~hw
        own = np.exp(self._pace.own(n))
        before, known = self._pace.learned(n), self._pace.known(n)
        groups = self._peers.group_ids(n)
        evident = self._pace.update(now, ratio, clean, t.job[:n], groups)
        newly = self._pace.learned(n) & ~before
        first = self._pace.known(n) & ~known
        placed = self._placement.update(self._pace, newly, t.job[:n], groups, first)
        broken = self._placement.broken(self._pace, n)
        placed &= ~broken
        # not before the GPU's first readings give its pace: against the peers alone a part slower
        # from its start looks like a live fault, and where evaluations come 10 s apart those
        # readings take 300 s, past the minute the fast path needs (a slower bin paged for minutes)
        # the fixed bar, or two sigmas of one reading where readings are noisier (10 % apart, a
        # third of them sat 4 % under the pace, and healthy GPUs paged 40 times in 2 hours)
        bar = np.exp(-self._pace.reading_bar(n, -math.log(self.lag_ratio)))
        slow = clean & (ratio < bar * own) & self._pace.known(n)
        lagging = self._slow.update(now, slow)
        self._held = lagging | evident | broken
        out: list[Finding] = []
        for i in np.flatnonzero(self._power.update(now, power) & recent).tolist():
            out.append(self._power_finding(i, bool(brake[i])))
        for i in np.flatnonzero(self._held & recent).tolist():
            finding = self._slow_finding(i, float(ratio[i]), float(peers[i]), float(own[i]))
            out.append(self._from_start(i, finding) if broken[i] else finding)
        for i in np.flatnonzero(placed & recent).tolist():
            out.append(self._placement_finding(i))
        for i in np.flatnonzero(alone & recent & ~self._held).tolist():
            out.append(self._alone_finding(i))
        return out

    def _alone_slow(self, recent: BoolArray, util: FloatArray, flagged: BoolArray) -> BoolArray:
        """Per GPU with too few peers in its job: under load, no clock event reason, and its SM clock
        ``alone_ratio`` or further below the fastest such clock of its node or of its own past."""
        t = self.table
        n = len(recent)
        sm = t.column("gpu_sm_clock_mhz")
        reasons = t.column("gpu_clock_event_reasons")
        plain = recent & (reasons == 0) & ~flagged & (util >= self.busy_percent) & np.isfinite(sm)
        node = t.node[:n]
        top = group_max(sm, node, plain, len(t.node_codes))
        self._best = grow(self._best, n, -math.inf)
        best = self._best[:n]
        best[plain] = np.maximum(best[plain], sm[plain])
        ref = np.maximum(top[node], best)
        self._alone_ref = ref
        job = t.job[:n]
        members = group_count(recent, job, len(t.job_names))
        few = (job < 0) | (members[np.maximum(job, 0)] <= self._peers.min_peers)
        cond: BoolArray = plain & few & (sm < self.alone_ratio * ref)
        return cond

    def _alone_finding(self, i: int) -> Finding:
        t = self.table
        node, gpu = t.keys[i]
        code = int(t.job[i])
        job = t.job_names[code] if code >= 0 else None
        clock = float(t.column("gpu_sm_clock_mhz")[i])
        ref = float(self._alone_ref[i])
        ratio = clock / ref
        whose = f"job {job}" if job is not None else "no job"
        return Finding(
            SLOW,
            {"node": node, "gpu": gpu},
            f"{node} GPU {gpu} runs at {clock:.0f} MHz under load with no clock event reason, "
            f"{1 - ratio:.0%} below the {ref:.0f} MHz its part runs at (its node's GPUs or its own past); "
            f"too few GPUs in {whose} to compare it with",
            value=ratio,
            details={
                "clock_ratio_to_part": ratio,
                "reference_clock_mhz": ref,
                "job": job,
                "peers": False,
            },
        )

    def _placement_finding(self, i: int) -> Finding:
        t = self.table
        node, gpu = t.keys[i]
        code = int(t.job[i])
        job = t.job_names[code]
        lag = 1.0 - math.exp(-float(self._placement.shown[i]))
        world = int(np.count_nonzero(t.job[: t.n] == code))
        group = self._peers.group_of(code, i)
        # a synchronous job waits for its slowest GPU: running ``lag`` slower loses that share of
        # every GPU's time, the same cost basis as a slow group of ranks
        return Finding(
            PLACEMENT,
            {"job": job, "node": node, "gpu": gpu},
            f"{node} GPU {gpu} has run {lag:.1%} slower than the other GPUs of its speed group in job "
            f"{job} since it started (its part or its placement, not a live fault); a synchronous job "
            f"runs at its pace, so it loses {lag:.1%} of its {world} GPUs' time",
            value=lag,
            affected_gpus=world,
            at_risk=lag,
            details={"lag_share": lag, "lost_share": lag, "job": job, "speed_group": group},
        )

    def _from_start(self, i: int, finding: Finding) -> Finding:
        """``finding`` of a GPU that has lagged its speed group by the pace's bound or more since it
        started: a faulty part, whose cost is the job's, as for a placement (the job waits for it).
        Its other paths judge it against its pace held at the bound, so they see the rest of the same
        lag, not a new slowdown: what they say is left to ``details`` (``ratio_to_own_pace``)."""
        t = self.table
        node, gpu = t.keys[i]
        code = int(t.job[i])
        lag = 1.0 - math.exp(-float(self._placement.shown[i]))
        world = int(np.count_nonzero(t.job[: t.n] == code))
        job = finding.details["job"]
        bound = self._pace.max_pace
        said = (
            f"{node} GPU {gpu} has run {lag:.1%} slower than the other GPUs of its speed group in job {job} "
            f"since it started, past the {bound:.0%} parts of one model may differ by: a faulty part, not "
            f"a slower bin; a synchronous job runs at its pace, so it loses {lag:.1%} of its {world} GPUs' "
            "time"
        )
        return Finding(
            SLOW,
            finding.entity,
            said,
            value=1.0 - lag,
            affected_gpus=world,
            at_risk=lag,
            details={**finding.details, "since_start": True, "lag_share": lag, "lost_share": lag},
        )

    def _power_finding(self, i: int, brake: bool) -> Finding:
        node, gpu = self.table.keys[i]
        share = float(self._power.share[i])
        power = self.table.column("gpu_power_watts")[i]
        limit = self.table.column("gpu_power_limit_watts")[i]
        lowered = bool(self._lowered[i])
        node_limit = float(self._node_limit[i])
        why = "the external power brake is engaged" if brake else "clocks are held down by the power cap"
        watts = (
            f" ({power:.0f} W of {limit:.0f} W allowed)"
            if math.isfinite(power) and math.isfinite(limit)
            else ""
        )
        said = f"{node} GPU {gpu}: {why}{watts} for {share:.0%} of the last minute under load"
        if lowered and not brake:
            drawing = f"drawing {power:.0f} W" if math.isfinite(power) else "its draw unknown"
            now = (
                f"its clocks are held down by the cap ({drawing})"
                if self._capped[i]
                else f"{drawing} now, its clocks fall as soon as its load reaches the cap"
            )
            said = (
                f"{node} GPU {gpu}: its enforced power limit is lowered to {limit:.0f} W, "
                f"{limit / node_limit:.0%} of the {node_limit:.0f} W its node's other GPUs enforce; {now}"
            )
        return Finding(
            POWER,
            {"node": node, "gpu": gpu},
            said,
            value=share,
            details={
                "throttled_share": share,
                "brake": brake,
                "power_watts": power if math.isfinite(power) else None,
                "power_limit_watts": limit if math.isfinite(limit) else None,
                "limit_lowered": lowered,
                "node_power_limit_watts": node_limit if math.isfinite(node_limit) else None,
            },
        )

    def _slow_finding(self, i: int, ratio: float, peers: float, own: float) -> Finding:
        node, gpu = self.table.keys[i]
        code = int(self.table.job[i])
        job = self.table.job_names[code] if code >= 0 else "?"
        group = self._peers.group_of(code, i)
        clock = ratio * peers
        # the recent shortfall once the pace is learned: one reading of a small slowdown is mostly noise
        learned = bool(self._pace.count[i] >= self._pace.learn)
        pace = math.exp(-float(self._pace.shortfall[i])) if learned else ratio
        usual = f", its usual pace {own:.0%} of theirs" if abs(own - 1.0) >= 0.005 else ""
        finite = math.isfinite(pace)
        return Finding(
            SLOW,
            {"node": node, "gpu": gpu},
            f"{node} GPU {gpu} runs at {clock:.0f} MHz, {1 - pace:.1%} below its pace against the other GPUs "
            f"of job {job} ({peers:.0f} MHz{usual}) with no throttle reason",
            value=pace if finite else None,
            details={
                "clock_ratio_to_peers": ratio if math.isfinite(ratio) else None,
                "ratio_to_own_pace": pace if finite else None,
                "own_pace": own,
                "job": job,
                "speed_group": group,
            },
        )
