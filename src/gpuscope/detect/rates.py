"""Error counters that climb: ``gpu_ecc_correctable_rising``, ``pcie_replay_rising``, ``nvlink_errors``.

Each counter is turned into a decaying windowed count (``count = count * exp(-dt / tau) + new``),
so ``count`` is about the errors of the last ``tau`` seconds whatever the sampling rate. A GPU
fires when that count reaches ``min_count`` *and* its rate is ``factor`` times its own long-run
rate (a slow EWMA, frozen while firing, so a GPU that always logs a few replays is not news).
Counter drops are resets (a reboot), not negative errors. NVLink also fires at once when links go
down that were up when the GPU was first seen. Vectorised over every GPU; one pass per evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuscope.detect.base import GpuTableDetector, register
from gpuscope.detect.frames import BoolArray
from gpuscope.detect.vectors import grow
from gpuscope.model import Finding, FloatArray


@dataclass(frozen=True, slots=True)
class CounterRule:
    rule: str
    metrics: tuple[str, ...]  # summed
    what: str
    tau: float = 300.0
    min_count: float = 3.0
    factor: float = 10.0
    floor_rate: float = 1e-3  # errors/s below which the own baseline is not trusted to be lower


RULES = (
    CounterRule(
        "gpu_ecc_correctable_rising",
        ("gpu_ecc_sbe_aggregate_total",),
        "corrected ECC errors",
        tau=600.0,
    ),
    CounterRule("pcie_replay_rising", ("gpu_pcie_replay_total",), "PCIe replays", tau=600.0),
    CounterRule(
        "nvlink_errors",
        ("gpu_nvlink_crc_errors_total", "gpu_nvlink_replay_errors_total", "gpu_nvlink_recovery_errors_total"),
        "NVLink CRC/replay/recovery errors",
        tau=180.0,
    ),
)
LINKS_DOWN = "gpu_nvlink_links_down"
FALLBACK = {"gpu_ecc_sbe_aggregate_total": "gpu_ecc_sbe_volatile_total"}
LONG_TAU = 6 * 3600.0


class _State:
    """Per-rule arrays over GPU ids."""

    def __init__(self) -> None:
        self.prev: FloatArray = np.zeros(0)
        self.prev_ts: FloatArray = np.zeros(0)
        self.count: FloatArray = np.zeros(0)
        self.base_rate: FloatArray = np.zeros(0)
        self.firing: BoolArray = np.zeros(0, bool)

    def ensure(self, n: int) -> None:
        if len(self.prev) < n:
            self.prev = grow(self.prev, n)
            self.prev_ts = grow(self.prev_ts, n)
            self.count = grow(self.count, n, 0.0)
            self.base_rate = grow(self.base_rate, n, 0.0)
            firing = np.zeros(len(self.prev), bool)
            firing[: len(self.firing)] = self.firing
            self.firing = firing


@register
class ErrorRateDetector(GpuTableDetector):
    rules = tuple(r.rule for r in RULES)
    metrics = tuple(sorted({m for r in RULES for m in r.metrics} | set(FALLBACK.values()) | {LINKS_DOWN}))

    def __init__(self) -> None:
        super().__init__()
        self._states = {r.rule: _State() for r in RULES}
        self._links0: FloatArray = np.zeros(0)

    def _total(self, rule: CounterRule) -> FloatArray:
        cols = []
        for m in rule.metrics:
            col = self.table.column(m)
            if m in FALLBACK:
                col = np.where(np.isfinite(col), col, self.table.column(FALLBACK[m]))
            cols.append(col)
        stack = np.vstack(cols)
        finite = np.isfinite(stack)
        # a source that exports only some of the summed counters (CRC but no replay or recovery
        # count) is judged on those it has, not dropped as NaN
        total: FloatArray = np.where(finite.any(axis=0), np.where(finite, stack, 0.0).sum(axis=0), np.nan)
        total[total < 0] = np.nan  # a counter cannot be negative: a bogus reading, not a reset
        return total

    def evaluate(self, now: float) -> list[Finding]:
        n = self.table.n
        if n == 0:
            return []
        ts = self.table.ts[:n]
        recent = self.table.recent(now, 120.0)
        out: list[Finding] = []
        for rule in RULES:
            state = self._states[rule.rule]
            state.ensure(n)
            total = self._total(rule)
            prev, prev_ts = state.prev[:n], state.prev_ts[:n]
            dt = ts - prev_ts
            seen = np.isfinite(total) & np.isfinite(prev) & (dt > 0)
            delta = np.where(seen, np.maximum(total - prev, 0.0), 0.0)  # a drop is a reset
            decay = np.where(seen, np.exp(-np.where(seen, dt, 0.0) / rule.tau), 1.0)
            count = state.count[:n]
            count *= decay
            count += delta
            rate = count / rule.tau
            base = state.base_rate[:n]
            hot = (count >= rule.min_count) & (rate >= rule.factor * np.maximum(base, rule.floor_rate))
            firing = state.firing[:n]
            firing[:] = recent & (hot | (firing & (count >= 0.5 * rule.min_count)))
            learn = seen & ~firing
            a = 1.0 - np.exp(-np.where(learn, dt, 0.0) / LONG_TAU)
            inst = np.where(learn, delta / np.where(seen, dt, 1.0), 0.0)
            base += a * (inst - base)
            fresh = np.isfinite(total) & (seen | ~np.isfinite(prev))
            prev[fresh] = total[fresh]
            prev_ts[fresh] = ts[fresh]
            links = self._links_down(n) if rule.rule == "nvlink_errors" else np.zeros(n)
            for i in np.flatnonzero(firing | ((links > 0) & recent)).tolist():
                out.append(self._finding(rule, i, float(count[i]), float(base[i]), float(links[i])))
        return out

    def _links_down(self, n: int) -> FloatArray:
        """Links down now beyond those already down when the GPU was first seen."""
        links = self.table.column(LINKS_DOWN)
        if len(self._links0) < n:
            old = len(self._links0)
            self._links0 = grow(self._links0, n)
            self._links0[old:] = math.nan
        first = self._links0[:n]
        unset = ~np.isfinite(first) & np.isfinite(links)
        first[unset] = links[unset]
        return np.where(np.isfinite(links) & np.isfinite(first), links - first, 0.0)

    def _finding(self, rule: CounterRule, i: int, count: float, base: float, links: float) -> Finding:
        node, gpu = self.table.keys[i]
        parts = []
        if count >= 0.5 * rule.min_count:
            parts.append(
                f"{count:.0f} {rule.what} in about the last {rule.tau:.0f} s (usual rate {base * 3600:.2f}/h)"
            )
        if links > 0:
            parts.append(f"{links:.0f} NVLink link(s) went down")
        return Finding(
            rule.rule,
            {"node": node, "gpu": gpu},
            f"{node} GPU {gpu}: " + "; ".join(parts),
            value=count,
            details={
                "windowed_count": count,
                "window_seconds": rule.tau,
                "baseline_per_hour": base * 3600,
                "links_down": links,
            },
        )
