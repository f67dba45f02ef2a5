"""The latest values of a few GPU metrics for every GPU, as dense arrays: the vectorised detectors' input.

``on_frame`` only scatters a frame's rows into one matrix (a single numpy operation per frame: the
metrics are its columns, each frame layout's column map computed once);
detectors do their arithmetic once per evaluation over all GPUs at once. Each GPU gets a dense id
the first time it is seen; its job (attribution label) and its node are kept as small integer
codes, so peers and a node's GPUs can be grouped without Python loops (the table is the one home
of both codes: detectors read ``job`` and ``node``, never number them themselves).
"""

from __future__ import annotations

import math

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.frames import FrameView, GpuKey, TickRows
from gpuscope.detect.vectors import IntArray, grow, grow_codes
from gpuscope.model import FloatArray

#: distinct frame layouts (metric tuples) whose column maps are kept
_MAX_LAYOUTS = 256


class GpuTable:
    """Latest value per GPU of ``metrics`` (NaN when never reported), its timestamp and its job.

    Latest by the frame's time, not by arrival: in a cluster a part a peer hub forwards can arrive
    after a newer one sent straight, and a replayed one after live ones. A GPU's row older than the
    one the table holds is stale: it is counted (``detect_stale_gpu_rows``) and not written, so no
    detector reading the table sees time go backwards."""

    def __init__(self, metrics: tuple[str, ...], counters: Counters | None = None) -> None:
        self.metrics = metrics
        self.counters = counters or Counters()
        self._slot = {m: j for j, m in enumerate(metrics)}
        self.ids: dict[GpuKey, int] = {}
        self.keys: list[GpuKey] = []
        #: one row per GPU, one column per metric (a C-ordered matrix, so a GPU's row is one write)
        self._matrix: FloatArray = np.zeros((0, len(metrics)))
        #: per frame metric layout: (frame columns, matrix columns) of the metrics both hold
        self._layouts: dict[tuple[str, ...], tuple[IntArray, IntArray]] = {}
        self.ts: FloatArray = np.zeros(0)
        self.job: IntArray = np.zeros(0, np.intp)
        self.job_codes: dict[str, int] = {}
        self.job_names: list[str] = []
        #: per GPU id, its node's code (a GPU's node never changes: set once, when the GPU is first seen)
        self.node: IntArray = np.zeros(0, np.intp)
        self.node_codes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def _id(self, key: GpuKey) -> int:
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.keys)
            self.keys.append(key)
            n = len(self.keys)
            if len(self._matrix) < n:
                matrix = np.full((max(n, 2 * len(self._matrix), 16), len(self.metrics)), math.nan)
                matrix[: len(self._matrix)] = self._matrix
                self._matrix = matrix
            self.ts = grow(self.ts, n, -math.inf)
            self.job, self.node = grow_codes(self.job, n), grow_codes(self.node, n)
            self.node[i] = self.node_codes.setdefault(key[0], len(self.node_codes))
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
        return self._ingest_one(v, tuple(v.frame.metrics), None)

    def _ingest_one(self, v: FrameView, names: tuple[str, ...], stacked: FloatArray | None) -> IntArray:
        """:meth:`ingest`; ``stacked``: the frame's GPU rows, all columns, where a tick's stack
        holds them."""
        ids = np.fromiter((self._id(k) for k in v.gpu_keys), np.intp, len(v.gpu_keys))
        source, target = self._layout(names, v)
        jobs = np.fromiter((self.job_code(j) for j in v.gpu_jobs), np.intp, len(ids))
        fresh = self._fresh(ids, np.full(len(ids), v.frame.ts))
        rows = None
        if len(target):
            rows = v.gpu_rows_of(source) if stacked is None else stacked[:, source]
        if fresh is not None:
            kept, jobs = ids[fresh], jobs[fresh]
            rows = rows[fresh] if rows is not None else None
        else:
            kept = ids
        if rows is not None:
            self._matrix[kept[:, None], target] = rows
        self.ts[kept] = v.frame.ts
        self.job[kept] = jobs
        return ids

    def ingest_many(self, tick: TickRows) -> None:
        """Scatter a tick's frames' GPU rows as :meth:`ingest` one after the other would:
        consecutive frames with one metric layout (a tick of agents' batches) in one write, the
        last report of a GPU winning. The rows are read from the tick's stacks (built once for the
        engine's row tests too)."""
        views = tick.views
        for block, first, last in tick.runs():
            stacked = block.values[int(block.starts[first]) : int(block.ends[last - 1])]
            run = [views[k] for k in block.members[first:last]]
            if len(run) == 1:
                self._ingest_one(run[0], block.names, stacked)
            else:
                self._ingest_run(run, block.names, stacked)

    def _ingest_run(self, run: list[FrameView], names: tuple[str, ...], stacked: FloatArray) -> None:
        keys = [k for v in run for k in v.gpu_keys]
        ids = np.fromiter((self._id(k) for k in keys), np.intp, len(keys))
        counts = [len(v.gpu_keys) for v in run]
        ts = np.repeat(np.array([v.frame.ts for v in run]), counts)
        jobs = np.fromiter((self.job_code(j) for v in run for j in v.gpu_jobs), np.intp, len(keys))
        source, target = self._layout(names, run[0])
        rows = stacked[:, source] if len(target) else None
        if len(np.unique(ids)) < len(ids):  # a GPU twice (two ticks of a node): its newest report wins
            order = np.lexsort((np.arange(len(ids)), ts, ids))  # by GPU, then time, then arrival
            last = order[np.r_[ids[order][1:] != ids[order][:-1], True]]
            # a report that arrived after a newer one of its GPU in this run is stale too
            newest = np.empty(len(self.keys), np.intp)
            newest[ids[last]] = last
            late = np.count_nonzero((np.arange(len(ids)) > newest[ids]) & (ts < ts[newest[ids]]))
            if late:
                self.counters.inc("detect_stale_gpu_rows", int(late))
            ids, ts, jobs = ids[last], ts[last], jobs[last]
            rows = rows[last] if rows is not None else None
        fresh = self._fresh(ids, ts)
        if fresh is not None:
            ids, ts, jobs = ids[fresh], ts[fresh], jobs[fresh]
            rows = rows[fresh] if rows is not None else None
        if rows is not None:
            self._matrix[ids[:, None], target] = rows
        self.ts[ids] = ts
        self.job[ids] = jobs

    def _fresh(self, ids: IntArray, ts: FloatArray) -> np.ndarray[tuple[int], np.dtype[np.bool_]] | None:
        """Which of these rows are not older than what the table holds for their GPU; None when all
        are (the usual case: nothing to select). The stale ones are counted."""
        fresh = ts >= self.ts[ids]
        if fresh.all():
            return None
        self.counters.inc("detect_stale_gpu_rows", int(len(fresh) - np.count_nonzero(fresh)))
        return fresh

    def _layout(self, names: tuple[str, ...], v: FrameView) -> tuple[IntArray, IntArray]:
        """(frame columns, matrix columns) of the metrics both hold, for frames with the metrics
        ``names`` (``v`` one of them): the frame's positions are its own, as every stage reads them
        (:func:`gpuscope.model.positions`, the first column of a name given twice)."""
        layout = self._layouts.get(names)
        if layout is None:
            pairs = [(j, k) for m, k in self._slot.items() if (j := v.position(m)) is not None]
            layout = (np.array([j for j, _ in pairs], np.intp), np.array([k for _, k in pairs], np.intp))
            if len(self._layouts) >= _MAX_LAYOUTS:  # senders with ever-new layouts: start afresh
                self._layouts.clear()
            self._layouts[names] = layout
        return layout

    def column(self, metric: str) -> FloatArray:
        """Latest values of ``metric`` over every known GPU (a view; do not write)."""
        return self._matrix[: len(self.keys), self._slot[metric]]

    @property
    def n(self) -> int:
        return len(self.keys)

    def recent(self, now: float, horizon: float) -> np.ndarray[tuple[int], np.dtype[np.bool_]]:
        """GPUs that reported within ``horizon`` seconds of ``now`` (hub time vs data time)."""
        ts = self.ts[: self.n]
        newest = float(ts.max()) if ts.size else -math.inf
        return ts >= min(now, newest) - horizon
