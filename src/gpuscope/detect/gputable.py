"""The latest values of a few GPU metrics for every GPU, as dense arrays: the vectorised detectors' input.

``on_frame`` only scatters a frame's rows into the arrays (one numpy operation per metric);
detectors do their arithmetic once per evaluation over all GPUs at once. Each GPU gets a dense id
the first time it is seen; its job (attribution label) is kept as a small integer code so peers
can be grouped without Python loops.
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect.frames import FrameView, GpuKey
from gpuscope.detect.vectors import IntArray, grow
from gpuscope.model import FloatArray


class GpuTable:
    """Latest value per GPU of ``metrics`` (NaN when never reported), its timestamp and its job."""

    def __init__(self, metrics: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.ids: dict[GpuKey, int] = {}
        self.keys: list[GpuKey] = []
        self.values: dict[str, FloatArray] = {m: np.zeros(0) for m in metrics}
        self.ts: FloatArray = np.zeros(0)
        self.job: IntArray = np.zeros(0, np.intp)
        self.job_codes: dict[str, int] = {}
        self.job_names: list[str] = []

    def __len__(self) -> int:
        return len(self.keys)

    def _id(self, key: GpuKey) -> int:
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.keys)
            self.keys.append(key)
            n = len(self.keys)
            for m in self.metrics:
                self.values[m] = grow(self.values[m], n)
            self.ts = grow(self.ts, n, -math.inf)
            if len(self.job) < n:
                job = np.full(len(self.ts), -1, np.intp)
                job[: len(self.job)] = self.job
                self.job = job
        return i

    def job_code(self, name: str | None) -> int:
        if name is None:
            return -1
        code = self.job_codes.get(name)
        if code is None:
            code = self.job_codes[name] = len(self.job_names)
            self.job_names.append(name)
        return code

    def ingest(self, v: FrameView) -> IntArray | None:
        """Scatter one frame's GPU rows; returns their ids (None when the frame has no GPU rows)."""
        if not v.gpu_keys:
            return None
        ids = np.fromiter((self._id(k) for k in v.gpu_keys), np.intp, len(v.gpu_keys))
        for m in self.metrics:
            column = v.gpu_column(m)
            if column is not None:
                self.values[m][ids] = column
        self.ts[ids] = v.frame.ts
        self.job[ids] = [self.job_code(j) for j in v.gpu_jobs]
        return ids

    def column(self, metric: str) -> FloatArray:
        """Latest values of ``metric`` over every known GPU (a view; do not write)."""
        return self.values[metric][: len(self.keys)]

    @property
    def n(self) -> int:
        return len(self.keys)

    def recent(self, now: float, horizon: float) -> np.ndarray[tuple[int], np.dtype[np.bool_]]:
        """GPUs that reported within ``horizon`` seconds of ``now`` (hub time vs data time)."""
        ts = self.ts[: self.n]
        newest = float(ts.max()) if ts.size else -math.inf
        return ts >= min(now, newest) - horizon
