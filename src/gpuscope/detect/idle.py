"""GPUs a job holds but does not use: ``gpu_idle_allocated``.

A GPU is idle when it carries a job's label and shows (almost) no kernel activity; smoothed into
the share of the last ``tau`` seconds it was idle, a GPU counts as idle from ``idle_share``. A job
fires when at least ``job_share`` of its recently reporting GPUs are idle: one GPU between two
kernels is normal, the whole allocation sitting still for minutes is money burning. Checkpoint
writes and initialisation keep some activity and never reach the share; GPUs without a job label
are free, not wasted.
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.base import GpuTableDetector, register
from gpuscope.detect.vectors import group_count, grow
from gpuscope.model import Finding, FloatArray
from gpuscope.rules import GPU_IDLE_ALLOCATED as RULE


@register
class IdleAllocationDetector(GpuTableDetector):
    rules = (RULE,)
    metrics = ("gpu_utilization_percent", "gpu_sm_active_ratio")

    def __init__(
        self, tau: float = 60.0, idle_share: float = 0.9, job_share: float = 0.75, util_percent: float = 3.0
    ) -> None:
        self.tau, self.idle_share, self.job_share, self.util_percent = (
            tau,
            idle_share,
            job_share,
            util_percent,
        )
        super().__init__()
        self._share: FloatArray = np.zeros(0)
        self._last: float | None = None

    def evaluate(self, now: float) -> list[Finding]:
        t = self.table
        n = t.n
        if n == 0:
            return []
        self._share = grow(self._share, n, 0.0)
        recent = t.recent(now, 10.0)
        job = t.job[:n]
        util = t.column("gpu_utilization_percent")
        sm = t.column("gpu_sm_active_ratio")
        idle = recent & (job >= 0) & (util < self.util_percent) & ~(sm >= 0.02)
        dt = 1.0 if self._last is None else min(max(now - self._last, 0.0), 5.0)
        self._last = now
        share = self._share[:n]
        share += (1.0 - math.exp(-dt / self.tau)) * (idle.astype(float) - share)
        share[job < 0] = 0.0
        size = len(t.job_names) + 1
        members = group_count(recent & (job >= 0), job, size)
        idle_gpus = group_count(recent & (share >= self.idle_share), job, size)
        out: list[Finding] = []
        for code in np.flatnonzero((idle_gpus > 0) & (idle_gpus >= self.job_share * members)).tolist():
            name = t.job_names[code]
            count = int(idle_gpus[code])
            rows = np.flatnonzero(recent & (job == code)).tolist()
            nodes = sorted({t.keys[i][0] for i in rows})
            out.append(
                Finding(
                    RULE,
                    {"job": name},
                    f"Job {name} holds {count} of {int(members[code])} GPUs idle for most of the "
                    f"last {self.tau:.0f} s (under {self.util_percent:.0f}% utilisation)",
                    value=float(count),
                    affected_gpus=count,
                    details={
                        "idle_gpus": count,
                        "gpus": int(members[code]),
                        "links": [{"node": x} for x in nodes],
                    },
                )
            )
        return out
