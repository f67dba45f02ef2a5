"""Uncorrectable memory errors: ``gpu_ecc_uncorrectable``.

Triggers: an ``ecc_dbe`` event; a rise of the volatile or aggregate DBE counter or of the rows
remapped for uncorrectable errors; a row-remap failure. Lifetime (aggregate) counters and rows
already remapped when a GPU is first seen are history, not news: they set the baseline. The
finding holds while the volatile DBE count is above zero (the GPU has not been reset since) or a
row remap has failed, and for ``hold`` seconds after the last trigger. A drop of the volatile
count is a reset, which ends the hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, register
from gpuscope.detect.frames import FrameView, GpuKey, view
from gpuscope.detect.refusals import event_gpu, refuse
from gpuscope.model import Event, Finding, FloatArray, Frame
from gpuscope.rules import GPU_ECC_UNCORRECTABLE as RULE

VOLATILE = "gpu_ecc_dbe_volatile_total"
AGGREGATE = "gpu_ecc_dbe_aggregate_total"
REMAPPED = "gpu_remapped_rows_uncorrectable"
REMAP_FAILED = "gpu_remapped_rows_failure"
_METRICS = (VOLATILE, AGGREGATE, REMAPPED, REMAP_FAILED)
_RISES = {
    VOLATILE: "volatile DBE count",
    AGGREGATE: "lifetime DBE count",
    REMAPPED: "uncorrectable remapped rows",
}


@dataclass(slots=True)
class _Gpu:
    last: dict[str, float] = field(default_factory=dict)  # latest finite value per metric
    trigger_ts: float | None = None
    reason: str = ""
    dbe_events: int = 0
    #: the newest frame seen: a late frame (forwarded by a peer hub, replayed) is stale, and a stale
    #: non-zero count after a reset would read as a new rise and restart the hold
    ts: float = float("-inf")


@register
class EccDetector(Detector):
    rules = (RULE,)
    gpu_tests = (_METRICS,)

    def __init__(self, hold: float = 600.0) -> None:
        self.hold = hold
        self.counters = Counters()
        self._seen: set[GpuKey] = set()  # GPUs whose baseline is known (all zero unless in _gpus)
        self._gpus: dict[GpuKey, _Gpu] = {}

    def on_event(self, event: Event) -> None:
        if event.kind != "ecc_dbe":
            return
        key = event_gpu(self.counters, event, "ecc_events_without_gpu")
        if key is None:
            return
        node, gpu = key
        count = event.data.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int | float):
            refuse(
                self.counters,
                "ecc_events_bad_count",
                "ecc_dbe event at %s on %s/%s: data.count %r is not a number (counted as one error)",
                event.ts,
                node,
                gpu,
                count,
            )
            count = 1
        state = self._state((node, gpu))
        state.dbe_events += int(count)
        self._trigger(state, event.ts, f"{int(count)} uncorrectable ECC error(s) reported by the driver")

    def _state(self, key: GpuKey) -> _Gpu:
        state = self._gpus.get(key)
        if state is None:
            state = self._gpus[key] = _Gpu()
        return state

    @staticmethod
    def _trigger(state: _Gpu, ts: float, reason: str) -> None:
        if state.trigger_ts is None or ts >= state.trigger_ts:
            state.trigger_ts, state.reason = ts, reason

    def reads(self, frame: FrameView) -> bool:
        return bool(frame.gpu_keys) and any(m in frame.frame.metrics for m in _METRICS)

    def on_frame(self, frame: Frame) -> None:
        v = view(frame)
        if all(v.position(m) is None for m in _METRICS):
            return
        nonzero = v.gpu_positive(_METRICS)  # NaN > 0 is False: no error
        gpus = self._gpus
        if not gpus and not any(nonzero):  # the usual frame: no error, none to compare against
            self._seen.update(v.gpu_keys)
            return
        columns: list[tuple[str, FloatArray]] | None = None
        rows: list[list[float]] = []  # Python floats, converted once when a GPU needs them
        for i, key in enumerate(v.gpu_keys):
            state = gpus.get(key)
            if state is None and not nonzero[i]:
                self._seen.add(key)
                continue
            if columns is None:
                columns = [(m, c) for m in _METRICS if (c := v.gpu_column(m)) is not None]
                rows = np.column_stack([c for _, c in columns]).tolist()
            self._update(key, state or self._state(key), [m for m, _ in columns], rows[i], frame.ts)

    def _update(self, key: GpuKey, state: _Gpu, metrics: list[str], row: list[float], ts: float) -> None:
        if ts < state.ts:
            self.counters.inc("ecc_stale_frames")
            return
        state.ts = ts
        first = key not in self._seen
        self._seen.add(key)
        for metric, value in zip(metrics, row, strict=True):
            if value != value:  # NaN: not reported this time
                continue
            before = state.last.get(metric, None if first else 0.0)
            state.last[metric] = value
            if metric == VOLATILE and before is not None and value < before:
                state.trigger_ts, state.reason = None, ""  # a reset: volatile counters start again
                self.counters.inc("ecc_reset_seen")
            elif metric in _RISES and before is not None and value > before:
                self._trigger(state, ts, f"{_RISES[metric]} rose from {before:.0f} to {value:.0f}")

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for key, state in list(self._gpus.items()):
            volatile = state.last.get(VOLATILE, 0.0)
            failed = state.last.get(REMAP_FAILED, 0.0) > 0
            held = state.trigger_ts is not None and now - state.trigger_ts < self.hold
            if volatile > 0 or failed or held:
                out.append(self._finding(key, state, volatile, failed))
            elif not any(v > 0 for v in state.last.values()):
                del self._gpus[key]  # all clear and nothing left to compare against but zeros
        return out

    @staticmethod
    def _finding(key: GpuKey, state: _Gpu, volatile: float, failed: bool) -> Finding:
        node, gpu = key
        parts = [state.reason] if state.reason else []
        if volatile > 0:
            parts.append(f"{volatile:.0f} uncorrectable error(s) since the last reset")
        if failed:
            parts.append("a row remap failed: the GPU needs replacing")
        summary = f"Uncorrectable ECC error on {node} GPU {gpu}: " + "; ".join(parts)
        return Finding(
            RULE,
            {"node": node, "gpu": gpu},
            summary,
            value=volatile,
            details={
                "dbe_volatile": volatile,
                "dbe_aggregate": state.last.get(AGGREGATE),
                "remapped_rows_uncorrectable": state.last.get(REMAPPED),
                "remap_failed": failed,
                "dbe_events": state.dbe_events,
                "last_trigger_ts": state.trigger_ts,
            },
        )
