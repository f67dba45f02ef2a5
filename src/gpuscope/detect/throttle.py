"""Thermal slowdown: ``gpu_thermal_throttle``.

A GPU is a thermal problem when its clocks are held down by temperature for at least
``fire_fraction`` of the last ``window`` seconds (sustained or recurring), or when, under load, it
runs far hotter than the GPUs next to it doing the same work (same node, same job). The thermal
slowdown reasons count whatever the load: an idle GPU sits 40-50 °C under its slowdown temperature,
so one idle and still held down by heat has lost its cooling, and the next work placed on it runs
throttled (a service's GPU between requests, a job's GPUs left idle, a spare GPU). A blip of a second or
two is a small share of the window and is ignored. Once firing, the alert holds until the share
falls below ``clear_fraction``, so a recurring slowdown does not flap.

While it fires, a throttle that deepens is told again: the GPU's SM clock under load, the median of
its last ``recent`` seconds while held down, lower than when the alert was last told by the rule's
stage bar (:attr:`gpuscope.rules.RuleSpec.stages`), measured on the spread of the GPU's own
throttled clock as the alert opened, for the bar's hold, is a stage of worsening
(:mod:`gpuscope.detect.worsening`). A clock that hovers at the bar, or the noise of a steady
throttle, is not.

Only GPUs with a recent thermal sample keep state, so a healthy fleet costs a few vector
operations per frame.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.baseline import FlagWindow, finite_or_none
from gpuscope.detect.frames import BoolArray, FrameView, GpuKey, GpuRows, TickRows, view
from gpuscope.detect.worsening import Worsening
from gpuscope.model import Finding, FloatArray, Frame
from gpuscope.rules import GPU_THERMAL_THROTTLE as RULE
from gpuscope.rules import stages_of

STAGES = stages_of(RULE)

#: NVML clock event reasons: software (0x20) and hardware (0x40) thermal slowdown.
THERMAL_REASONS = 0x20 | 0x40
_FLAGS = ("gpu_throttle_sw_thermal", "gpu_throttle_hw_thermal")


@dataclass(slots=True)
class _Gpu:
    window: FlagWindow
    firing: bool = False
    cause: str = ""
    temp: float = math.nan
    peer_temp: float = math.nan
    idle: bool = False
    #: (ts, SM clock MHz) of its loaded samples under the condition, the last ``window`` seconds
    clocks: deque[tuple[float, float]] = field(default_factory=deque)
    #: while firing: its stages of worsening, in the inverse of its recent clock, and the bar
    worse: Worsening = field(default_factory=Worsening)
    stage_bar: float = math.nan
    clock_told: float = math.nan


def _spread(clocks: list[float]) -> float:
    """The scaled MAD of clock readings as a share of their median (NaN under five readings)."""
    if len(clocks) < 5:
        return math.nan
    values = np.asarray(clocks)
    middle = float(np.median(values))
    return 1.4826 * float(np.median(np.abs(values - middle))) / middle if middle > 0 else math.nan


_Lists = tuple[list[bool], list[bool], list[float] | None, list[float], list[bool], list[float] | None]


@dataclass(slots=True)
class _Rows:
    """What the rows of one stack of GPU rows say (see ``_judge``); as Python values on demand."""

    cond: BoolArray
    flags: BoolArray
    temp: FloatArray | None
    peer: FloatArray
    loaded: BoolArray
    #: per frame of the stack: any row under the condition
    any: list[bool]
    clock: FloatArray | None = None
    _lists: _Lists | None = None

    def lists(self) -> _Lists:
        if self._lists is None:
            temp = None if self.temp is None else self.temp.tolist()
            clock = None if self.clock is None else self.clock.tolist()
            lists = (
                self.cond.tolist(),
                self.flags.tolist(),
                temp,
                self.peer.tolist(),
                self.loaded.tolist(),
                clock,
            )
            self._lists = lists
        return self._lists


@dataclass(slots=True)
class _Judged:
    rows: _Rows
    start: int  # the frame's first row in the stack
    any: bool


@register
class ThermalThrottleDetector(Detector):
    rules = (RULE,)

    def __init__(
        self,
        window: float = 60.0,
        fire_fraction: float = 0.5,
        clear_fraction: float = 0.25,
        load_percent: float = 10.0,
        peer_delta: float = 15.0,
        min_peers: int = 3,
        recent: float = 15.0,
    ) -> None:
        self.window = window
        self.recent = recent
        self.fire_fraction = fire_fraction
        self.clear_fraction = clear_fraction
        self.load_percent = load_percent
        self.peer_delta = peer_delta
        self.min_peers = min_peers
        self.counters = Counters()
        self._gpus: dict[GpuKey, _Gpu] = {}
        self._node_ts: dict[str, float] = {}

    def on_frame(self, frame: Frame) -> None:
        self.on_frames(TickRows.of([view(frame)]))

    def on_frames(self, tick: TickRows) -> None:
        # what a GPU row says (throttle flags, hotter than its peers) depends on its frame alone:
        # judged for all of a tick's rows at once, on the tick's stacks; the windows then take
        # them frame by frame
        frames = tick.views
        judged: list[_Judged | None] = [None] * len(frames)
        for block in tick.blocks:
            rows = self._judge(frames, block)
            for m, k in enumerate(block.members):
                judged[k] = _Judged(rows, int(block.starts[m]), rows.any[m])
        gpus = self._gpus
        for v, j in zip(frames, judged, strict=True):
            ts = v.frame.ts
            steps = {node: ts - self._node_ts.get(node, math.nan) for node in v.nodes}
            for node in v.nodes:
                self._node_ts[node] = ts
            if j is None or (not gpus and not j.any):
                continue
            cond, flags, temp, peer, loaded, clock = j.rows.lists()
            for i, key in enumerate(v.gpu_keys, j.start):
                state = gpus.get(key)
                on = cond[i]
                if state is None:
                    if not on:
                        continue
                    state = gpus[key] = _Gpu(FlagWindow(self.window, max_step=5.0))
                step = steps.get(key[0], math.nan)
                state.window.push(ts, on, step if math.isfinite(step) else None)
                if on:
                    state.cause = "throttle_flags" if flags[i] else "hot_vs_peers"
                    state.temp = math.nan if temp is None else temp[i]
                    state.peer_temp = peer[i]
                    state.idle = not loaded[i]
                    mhz = math.nan if clock is None else clock[i]
                    if loaded[i] and mhz > 0:
                        state.clocks.append((ts, mhz))
                while state.clocks and state.clocks[0][0] <= ts - self.window:
                    state.clocks.popleft()

    def _judge(self, frames: list[FrameView], block: GpuRows) -> _Rows:
        """Per stacked GPU row: under a thermal condition, by its flags or hotter than its peers."""
        temp = block.column("gpu_temp_celsius")
        util = block.column("gpu_utilization_percent")
        n = len(block.values)
        # an unreported utilisation does not excuse a throttle
        loaded = np.ones(n, bool) if util is None else ~(util < self.load_percent)
        flags = self._flags(block, n)
        hot = np.zeros(n, bool)
        peer = np.full(n, math.nan)
        if temp is not None:
            usable = loaded & np.isfinite(temp)
            count = np.add.reduceat(usable, block.starts, dtype=np.intp)
            top = np.maximum.reduceat(np.where(usable, temp, -math.inf), block.starts)
            bottom = np.minimum.reduceat(np.where(usable, temp, math.inf), block.starts)
            # a frame whose loaded GPUs are few or all within peer_delta has none hotter than its peers
            spread = (count > self.min_peers) & (top - bottom >= self.peer_delta)
            for m in np.flatnonzero(spread).tolist():
                a, b = int(block.starts[m]), int(block.ends[m])
                self._hot(frames[block.members[m]], temp[a:b], usable[a:b], hot[a:b], peer[a:b])
        cond = flags | hot
        any_row = np.logical_or.reduceat(cond, block.starts).tolist()
        return _Rows(cond, flags, temp, peer, loaded, any_row, block.column("gpu_sm_clock_mhz"))

    @staticmethod
    def _flags(block: GpuRows, n: int) -> BoolArray:
        out = np.zeros(n, bool)
        for metric in _FLAGS:
            column = block.column(metric)
            if column is not None:
                out |= column > 0.5
        reasons = block.column("gpu_clock_event_reasons")
        if reasons is not None:
            known = np.isfinite(reasons)
            bits = np.where(known, reasons, 0.0).astype(np.int64)
            out |= known & ((bits & THERMAL_REASONS) != 0)
        return out

    def _hot(
        self, v: FrameView, temp: FloatArray, usable: BoolArray, hot: BoolArray, peer: FloatArray
    ) -> None:
        """GPUs of one frame at least ``peer_delta`` above the median of their peers (same node
        and job, loaded), written into ``hot`` and ``peer`` (the frame's rows)."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i in np.flatnonzero(usable).tolist():
            job = v.gpu_jobs[i]
            if job is not None:
                groups.setdefault((v.gpu_keys[i][0], job), []).append(i)
        for rows in groups.values():
            if len(rows) <= self.min_peers:
                continue
            temps = temp[rows]
            for k, i in enumerate(rows):
                others = np.delete(temps, k)
                median = float(np.median(others))
                peer[i] = median
                hot[i] = temps[k] >= median + self.peer_delta

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for key, state in list(self._gpus.items()):
            window = state.window
            if window.last is None or now - window.last > self.window:
                del self._gpus[key]  # no reports for a whole window: nothing left to judge
                continue
            share = window.fraction()
            was = state.firing
            state.firing = share >= (self.clear_fraction if was else self.fire_fraction)
            if state.firing:
                if not was:  # a new alert: its stages start again, the bar from its clock's spread
                    state.worse = Worsening()
                    state.stage_bar = STAGES.bar(_spread([c for _, c in state.clocks]))
                    state.clock_told = math.nan
                out.append(self._finding(key, state, share, self._stage(state, now)))
            elif not window.any_flag():
                del self._gpus[key]
        return out

    def _stage(self, state: _Gpu, now: float) -> int:
        """The stage of the firing alert after its clock of the last ``recent`` seconds."""
        recent = [c for ts, c in state.clocks if ts > now - self.recent]
        if not recent:
            return state.worse.stage
        clock = float(np.median(recent))
        stage = state.worse.stage
        if state.worse.follow(1.0 / clock, now, state.stage_bar, STAGES.hold) != stage or math.isnan(
            state.clock_told
        ):
            state.clock_told = clock
        return state.worse.stage

    def _finding(self, key: GpuKey, state: _Gpu, share: float, stage: int) -> Finding:
        node, gpu = key
        temp = f"{state.temp:.0f} °C" if math.isfinite(state.temp) else "temperature unknown"
        if state.cause == "hot_vs_peers":
            above = state.temp - state.peer_temp
            why = f"runs at {temp}, {above:.0f} °C above its peers ({state.peer_temp:.0f} °C)"
        else:
            why = f"clocks held down by temperature ({temp})"
        load = "while idle (its cooling, not its work)" if state.idle else "under load"
        summary = f"{node} GPU {gpu} {why} for {share:.0%} of the last {self.window:.0f} s {load}"
        if stage:
            summary += (
                f"; its clock fell materially {stage} time(s) while its alert was open, "
                f"to {state.clock_told:.0f} MHz"
            )
        return Finding(
            RULE,
            {"node": node, "gpu": gpu},
            summary,
            value=share,
            stage=stage,
            details={
                "throttled_share": share,
                "window_seconds": self.window,
                "cause": state.cause,
                "temp_celsius": finite_or_none(state.temp),
                "peer_temp_celsius": finite_or_none(state.peer_temp),
                "idle": state.idle,
                "sm_clock_mhz": finite_or_none(state.clock_told),
            },
        )
