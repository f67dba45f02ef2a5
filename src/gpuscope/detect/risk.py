"""A GPU that is wearing out: ``gpu_failure_risk``, a composite score per GPU.

Five kinds of evidence decay over ``tau`` (a day by default), each scaled to 0..1: corrected ECC
errors (``sbe_full`` of them is 1), rows remapped after correctable errors (``rows_full`` new
ones is 1; rows remapped before the hub first saw the GPU do not count), overheating episodes
(rising edges of a thermal throttle flag; ``throttle_full`` is 1: a healthy, cooled GPU has none,
while power-cap episodes are policy met under load, not wear, and do not count), XIDs (a fatal
one is 1, an application one 0.25) and peer lag (SM clock below its peers, as a share of time: the fast end of
its speed group in its job, :class:`~gpuscope.detect.peers.ClockPeers`, the reference
``gpu_underperforming`` uses, so many GPUs slowing together do not hide the lag of one and a slower
group the job was placed on from the start is not lag). The score is their sum; it fires at
``threshold`` and only with evidence of at least two kinds, so one noisy counter is never a risk.
At ``imminent`` the alert escalates to P2: the GPU is about to take its work down with it.
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.base import GpuTableDetector, register
from gpuscope.detect.frames import BoolArray
from gpuscope.detect.peers import ClockPeers
from gpuscope.detect.vectors import grow
from gpuscope.model import Event, Finding, FloatArray
from gpuscope.rules import GPU_FAILURE_RISK as RULE
from gpuscope.signals import FATAL_XIDS

_FLAGS = ("gpu_throttle_sw_thermal", "gpu_throttle_hw_thermal")
_KINDS = ("ecc", "rows", "throttle", "xid", "lag")
ROWS = "gpu_remapped_rows_correctable"
#: an SM clock below this share of its peers' lags
LAG_RATIO = 0.96


@register
class FailureRiskDetector(GpuTableDetector):
    rules = (RULE,)
    metrics = ("gpu_ecc_sbe_aggregate_total", ROWS, "gpu_sm_clock_mhz", "gpu_utilization_percent", *_FLAGS)

    def __init__(
        self,
        tau: float = 86400.0,
        threshold: float = 1.5,
        sbe_full: float = 200.0,
        throttle_full: float = 5.0,
        rows_full: float = 4.0,
        imminent: float = 3.0,
    ) -> None:
        self.tau, self.threshold, self.sbe_full, self.throttle_full = tau, threshold, sbe_full, throttle_full
        super().__init__()
        self._ev = {k: np.zeros(0) for k in _KINDS}
        self.rows_full, self.imminent = rows_full, imminent
        self._prev_sbe: FloatArray = np.zeros(0)
        self._prev_rows: FloatArray = np.zeros(0)
        self._prev_flag: FloatArray = np.zeros(0)
        self._xids: list[tuple[tuple[str, str], float]] = []
        self._last: float | None = None
        self._peers = ClockPeers()
        #: GPUs lagging at the last evaluation: they keep their speed group when it is learned again
        self._lagging: BoolArray = np.zeros(0, bool)

    def on_event(self, event: Event) -> None:
        if event.kind == "xid":
            node, gpu = event.labels.get("node"), event.labels.get("gpu")
            code = event.data.get("code")
            if node is not None and gpu is not None:
                self._xids.append(((node, gpu), 1.0 if code in FATAL_XIDS else 0.25))

    @staticmethod
    def _rise(total: FloatArray, prev: FloatArray) -> FloatArray:
        """How much a cumulative counter grew since the last evaluation (updates ``prev`` in place)."""
        known = np.isfinite(total)
        rise: FloatArray = np.where(known & np.isfinite(prev), np.maximum(total - prev, 0.0), 0.0)
        prev[known] = total[known]
        return rise

    def evaluate(self, now: float) -> list[Finding]:
        t = self.table
        n = t.n
        if n == 0:
            return []
        for k in _KINDS:
            self._ev[k] = grow(self._ev[k], n, 0.0)
        self._prev_sbe = grow(self._prev_sbe, n)
        self._prev_rows = grow(self._prev_rows, n)
        self._prev_flag = grow(self._prev_flag, n, 0.0)
        dt = 1.0 if self._last is None else max(now - self._last, 0.0)
        self._last = now
        decay = math.exp(-dt / self.tau)
        for k in _KINDS:
            self._ev[k][:n] *= decay
        self._ev["ecc"][:n] += (
            self._rise(t.column("gpu_ecc_sbe_aggregate_total"), self._prev_sbe[:n]) / self.sbe_full
        )
        self._ev["rows"][:n] += self._rise(t.column(ROWS), self._prev_rows[:n]) / self.rows_full
        flag = np.zeros(n)
        for m in _FLAGS:
            flag = np.maximum(flag, np.nan_to_num(t.column(m)) > 0.5)
        edges = (flag > 0.5) & (self._prev_flag[:n] < 0.5)
        self._prev_flag[:n] = flag
        self._ev["throttle"][:n] += edges / self.throttle_full
        for key, weight in self._xids:
            i = t.ids.get(key)
            if i is not None:
                self._ev["xid"][i] += weight
        self._xids.clear()
        recent = t.recent(now, 10.0)
        loaded = recent & (t.column("gpu_utilization_percent") >= 50.0)
        clock = np.where(loaded, t.column("gpu_sm_clock_mhz"), math.nan)
        ref, judged = self._peers.references(clock, t.job[:n], recent, self._lagging)
        lagging = judged & (clock < LAG_RATIO * ref)
        self._lagging = lagging
        self._ev["lag"][:n] += lagging * (dt / 3600.0)
        parts = np.stack([np.minimum(self._ev[k][:n], 1.0) for k in _KINDS])
        score = parts.sum(axis=0)
        kinds = (parts >= 0.1).sum(axis=0)
        out: list[Finding] = []
        for i in np.flatnonzero((score >= self.threshold) & (kinds >= 2)).tolist():
            node, gpu = t.keys[i]
            evidence = {k: round(float(parts[j, i]), 2) for j, k in enumerate(_KINDS)}
            listed = ", ".join(f"{k} {v:.2f}" for k, v in evidence.items() if v >= 0.1)
            out.append(
                Finding(
                    RULE,
                    {"node": node, "gpu": gpu},
                    f"{node} GPU {gpu} failure risk {score[i]:.2f} (evidence: {listed})",
                    value=float(score[i]),
                    details={"score": float(score[i]), "evidence": evidence},
                    severity="P2" if score[i] >= self.imminent else None,
                )
            )
        return out
