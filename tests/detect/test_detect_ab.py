"""A/B: the detection engine's cheaper paths give the findings of the paths they replaced.

The old paths are kept here: every on-frame detector handed every frame (the engine now skips those
a frame's layout gives nothing to read), the thermal-throttle detector judging each frame on its
own (now a tick's GPU rows in one pass), the network detector reading each counter as a numpy
scalar and the ECC detector testing each frame's rows with numpy calls of its own and looking every
GPU up (now the engine's row test of a tick's rows at once, and no look-up while no GPU has an
error); their code before the change is copied below, verbatim. Both engines see the same
simulated cluster, its agents' batches through the binary wire format (frames with layout
numbers, as a hub decodes them) and its SDKs' batches, with hardware faults, a degraded network,
a lost GPU and a node going down; at every evaluation the findings must be equal.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.detect import frames as frames_module
from gpuscope.detect.base import Detector
from gpuscope.detect.baseline import FlagWindow
from gpuscope.detect.ecc import _METRICS as ECC_METRICS
from gpuscope.detect.ecc import EccDetector
from gpuscope.detect.engine import DetectionEngine, load_detectors
from gpuscope.detect.frames import BoolArray, FrameView, TickRows, view
from gpuscope.detect.network import _COUNTERS, NetworkDetector, _Node
from gpuscope.detect.throttle import THERMAL_REASONS, ThermalThrottleDetector, _Gpu
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.model import Finding, FloatArray, Frame
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import parse_scenario

SCENARIO = """
name: ab-hardware
seed: 7
duration: 900
interval: 1
cluster: {nodes: 4, gpus_per_node: 8, gpu_model: H100-SXM5-80GB, price_per_gpu_hour: 2.5}
jobs:
  - {name: pretrain, kind: training, nodes: [node-0, node-1, node-2], step_time: 1.2, checkpoint_every: 300}
  - {name: chat-api, kind: inference, nodes: [node-3], gpus: [0, 1, 2, 3], rps: 40, model: chat, version: v7}
faults:
  - {at: 100, kind: thermal_throttle, target: {node: node-2, gpu: 4}, params: {temp: 90}, duration: 360}
  - {at: 150, kind: power_throttle, target: {node: node-0, gpu: 2}, params: {cap: 0.55}, duration: 300}
  - {at: 200, kind: ecc_dbe, target: {node: node-1, gpu: 3}}
  - {at: 300, kind: xid, target: {node: node-0, gpu: 1}, params: {code: 79}}
  - {at: 400, kind: network_degraded, target: {node: node-2}, duration: 200}
  - {at: 500, kind: gpu_lost, target: {node: node-3, gpu: 5}}
  - {at: 650, kind: node_down, target: {node: node-1}}
"""


class OldThrottle(ThermalThrottleDetector):
    """The thermal-throttle detector before the change: each frame judged on its own."""

    def on_frames(self, tick: TickRows) -> None:
        for v in tick.views:
            self.on_frame(v.frame)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        ts = frame.ts
        steps = {node: ts - self._node_ts.get(node, math.nan) for node in v.nodes}
        for node in v.nodes:
            self._node_ts[node] = ts
        if not v.gpu_keys:
            return
        temp = v.gpu_column("gpu_temp_celsius")
        clock = v.gpu_column("gpu_sm_clock_mhz")
        loaded = self._old_loaded(v)
        flags = self._old_flags(v) & loaded
        hot, peer = self._old_hot(v, temp, loaded)
        cond = flags | hot
        if not self._gpus and not cond.any():
            return
        gpus = self._gpus
        for i in range(len(v.gpu_keys)):
            key = v.gpu_keys[i]
            state = gpus.get(key)
            on = bool(cond[i])
            if state is None:
                if not on:
                    continue
                state = gpus[key] = _Gpu(FlagWindow(self.window, max_step=5.0))
            step = steps.get(key[0], math.nan)
            state.window.push(ts, on, step if math.isfinite(step) else None)
            if on:
                state.cause = "throttle_flags" if flags[i] else "hot_vs_peers"
                state.temp = math.nan if temp is None else float(temp[i])
                state.peer_temp = float(peer[i])
                mhz = math.nan if clock is None else float(clock[i])
                if loaded[i] and mhz > 0:  # the clocks a stage of worsening is judged on
                    state.clocks.append((ts, mhz))
            while state.clocks and state.clocks[0][0] <= ts - self.window:
                state.clocks.popleft()

    def _old_loaded(self, v: FrameView) -> BoolArray:
        util = v.gpu_column("gpu_utilization_percent")
        if util is None:
            return np.ones(len(v.gpu_keys), bool)
        return ~(util < self.load_percent)

    @staticmethod
    def _old_flags(v: FrameView) -> BoolArray:
        out = np.zeros(len(v.gpu_keys), bool)
        for metric in ("gpu_throttle_sw_thermal", "gpu_throttle_hw_thermal"):
            column = v.gpu_column(metric)
            if column is not None:
                out |= column > 0.5
        reasons = v.gpu_column("gpu_clock_event_reasons")
        if reasons is not None:
            known = np.isfinite(reasons)
            bits = np.where(known, reasons, 0.0).astype(np.int64)
            out |= known & ((bits & THERMAL_REASONS) != 0)
        return out

    def _old_hot(
        self, v: FrameView, temp: FloatArray | None, loaded: BoolArray
    ) -> tuple[BoolArray, FloatArray]:
        n = len(v.gpu_keys)
        hot = np.zeros(n, bool)
        peer = np.full(n, math.nan)
        if temp is None:
            return hot, peer
        usable = loaded & np.isfinite(temp)
        candidates = temp[usable]
        if len(candidates) <= self.min_peers or candidates.max() - candidates.min() < self.peer_delta:
            return hot, peer
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
        return hot, peer


class OldNetwork(NetworkDetector):
    """The network detector before the change: each counter read as a numpy scalar."""

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        if not v.node_rows:
            return
        cols = {m: v.column(m) for m in (*_COUNTERS, "node_ib_ports_down")}
        for name, row in v.node_rows.items():
            node = self._nodes.get(name)
            if node is None:
                node = self._nodes[name] = _Node()
            self._update(
                node, frame.ts, {m: (math.nan if c is None else float(c[row])) for m, c in cols.items()}
            )


class OldEcc(EccDetector):
    """The ECC detector before the change: its own row test per frame, every GPU looked up."""

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        columns = [(m, c) for m in ECC_METRICS if (c := v.gpu_column(m)) is not None]
        if not columns:
            return
        block = np.column_stack([c for _, c in columns])
        nonzero: list[bool] = np.asarray((block > 0).any(axis=1)).tolist()  # NaN > 0 is False: no error
        rows: list[list[float]] | None = None  # Python floats, converted once when a GPU needs them
        for i, key in enumerate(v.gpu_keys):
            state = self._gpus.get(key)
            if state is None and not nonzero[i]:
                self._seen.add(key)
                continue
            if rows is None:
                rows = block.tolist()
            self._update(key, state or self._state(key), [m for m, _ in columns], rows[i], frame.ts)


def _old_alive(v: FrameView) -> list[bool]:
    """``FrameView.gpu_alive`` before the change: the frame's own numpy calls."""
    rows = v.frame.values[v._gpu_index]
    alive = np.zeros(len(rows), bool)
    if rows.shape[1]:
        np.logical_not(np.isnan(rows).all(axis=1), out=alive)
    return [bool(a) for a in alive]


class EveryFrameEngine(DetectionEngine):
    """The engine before the change: every on-frame detector sees every frame."""

    def _frame_readers(self, view: FrameView) -> list[Detector]:
        return self._on_frame


def _engines(old_paths: bool) -> tuple[DetectionEngine, DetectionEngine]:
    registry = load_detectors()
    names = sorted(registry)
    new = DetectionEngine([registry[n]() for n in names])
    old_kinds = (
        {
            **registry,
            "ThermalThrottleDetector": OldThrottle,
            "NetworkDetector": OldNetwork,
            "EccDetector": OldEcc,
        }
        if old_paths
        else registry
    )
    old = EveryFrameEngine([old_kinds[n]() for n in names])
    return old, new


def _key(f: Finding) -> str:
    return repr((f.rule, sorted(f.entity.items()), f.summary, f.value, f.affected_gpus, f.at_risk, f.details))


def _run(old: DetectionEngine, new: DetectionEngine, wire: bool) -> set[str]:
    scenario = parse_scenario(SCENARIO)
    rules: set[str] = set()
    for tick in Simulator(scenario, t0=1.7e9).ticks():
        nodes = list(tick.node_batches.values())
        batches = [decode_frame(encode_frame(b)) for b in nodes] if wire else nodes
        batches += tick.sdk_batches
        now = max((f.ts for b in nodes for f in b.frames), default=1.7e9) + 0.5
        for engine in (old, new):
            engine.observe_many(batches)
        before = sorted(_key(f) for f in old.evaluate(now))
        after = sorted(_key(f) for f in new.evaluate(now))
        assert after == before, f"findings differ at {now - 1.7e9:.0f} s"
        rules.update(f.split("'")[1] for f in after)
    assert old.stats() == new.stats()
    return rules


@pytest.mark.parametrize("wire", [True, False], ids=["decoded-frames", "in-process-frames"])
def test_same_findings_as_every_frame_to_every_detector(wire: bool) -> None:
    rules = _run(*_engines(old_paths=True), wire=wire)
    # the faults were there to be found: both paths found them, the same way, at every tick
    assert {
        "gpu_thermal_throttle",
        "gpu_ecc_uncorrectable",
        "gpu_lost",
        "node_unreachable",
        "network_degraded",
    } <= rules


def test_one_frame_at_a_time_as_a_tick_at_once() -> None:
    """A detector fed frame by frame (a test, a replay) judges as one fed a tick's frames at once."""
    scenario = parse_scenario(SCENARIO)
    one, many = OldThrottle(), ThermalThrottleDetector()
    single = ThermalThrottleDetector()
    found = False
    for tick in Simulator(scenario, t0=1.7e9).ticks():
        frames = [f for b in tick.node_batches.values() for f in b.frames]
        for frame in frames:
            one.on_frame(frame)
            single.on_frame(frame)
        many.on_frames(TickRows.of([view(f) for f in frames]))
        now = max(f.ts for f in frames) + 0.5
        expected = sorted(_key(f) for f in one.evaluate(now))
        assert sorted(_key(f) for f in many.evaluate(now)) == expected
        assert sorted(_key(f) for f in single.evaluate(now)) == expected
        found = found or bool(expected)
    assert found


def test_row_tests_of_a_tick_as_frame_by_frame() -> None:
    """The engine's row tests of a tick's frames at once (all-NaN rows, ECC counters above zero)
    are each frame's own, decoded frames and in-process ones, SDK frames among them."""
    scenario = parse_scenario(SCENARIO)
    dead = errors = 0
    for k, tick in enumerate(Simulator(scenario, t0=1.7e9).ticks()):
        nodes = list(tick.node_batches.values())
        # a GPU that answered nothing (an all-NaN row), on a different node each tick
        first = nodes[k % len(nodes)].frames[0]
        empty = first.values.copy()
        empty[k % len(empty)] = np.nan
        blank = Frame(first.ts, first.metrics, first.entities, empty, first.layout)
        decoded = [decode_frame(encode_frame(b)) for b in nodes]
        for tick_frames in (
            [f for b in decoded for f in b.frames] + [blank],
            [f for b in nodes + tick.sdk_batches for f in b.frames] + [blank],
        ):
            views = [frames_module.index(f) for f in tick_frames]
            frames_module.judge_gpu_rows(frames_module.TickRows.of(views), [ECC_METRICS])
            for v in views:
                fresh = frames_module.index(v.frame)  # nothing filled in: each frame's own numpy calls
                assert v.gpu_alive() == fresh.gpu_alive() == _old_alive(v)
                columns = [c for m in ECC_METRICS if (c := v.gpu_column(m)) is not None]
                if columns:
                    old = np.asarray((np.column_stack(columns) > 0).any(axis=1)).tolist()
                    assert v.gpu_positive(ECC_METRICS) == fresh.gpu_positive(ECC_METRICS) == old
                    errors += sum(old)
                dead += v.gpu_alive().count(False)
    # the tests had something to find: the lost GPU's empty rows and the DBE's counters
    assert dead and errors
