"""A per-frame index shared by every detector: which rows are GPUs, their keys, their jobs.

The engine hands the same frame to each detector in turn; building the index once and reusing
it (a one-entry identity cache) keeps the per-frame cost flat as detectors are added. The row
roles depend on the frame's entities and metrics alone, so a decoded frame (whose
:attr:`~gpuscope.model.Frame.layout` a sender repeats every tick) reuses those of its layout; its
column positions are the frame's own (:func:`gpuscope.model.positions`), shared with every stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpuscope.model import MAX_LAYOUTS, FloatArray, Frame, positions

GpuKey = tuple[str, str]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class FrameView:
    """Row roles of one frame. A GPU row names ``node`` and ``gpu``; a node row names only ``node``.

    Service rows (which also carry ``node``) are neither: a service's own SDK may report them.
    """

    frame: Frame
    gpu_rows: list[int]
    gpu_keys: list[GpuKey]
    gpu_jobs: list[str | None]
    node_rows: dict[str, int]
    nodes: list[str]  # distinct nodes of the GPU and node rows: what the node's agent reports
    unplaced_gpu_rows: int
    _columns: dict[str, int] = field(default_factory=dict)
    _gpu_index: slice | npt.NDArray[np.intp] = field(default_factory=lambda: slice(0, 0))
    _gpu_alive: list[bool] | None = None
    #: per metric tuple asked for: per GPU row, is any of them above zero
    _gpu_positive: dict[tuple[str, ...], list[bool]] | None = None

    def column(self, metric: str) -> FloatArray | None:
        """One metric over every row of the frame, or None when the frame lacks it."""
        j = self._columns.get(metric)
        return None if j is None else self.frame.values[:, j]

    def position(self, metric: str) -> int | None:
        """Where ``metric`` is among the frame's columns, or None when the frame lacks it."""
        return self._columns.get(metric)

    def gpu_column(self, metric: str) -> FloatArray | None:
        """One metric over the GPU rows only (aligned with :attr:`gpu_keys`)."""
        j = self._columns.get(metric)
        return None if j is None else self.frame.values[self._gpu_index, j]

    def gpu_rows_of(self, columns: npt.NDArray[np.intp]) -> FloatArray:
        """The given columns (frame positions) over the GPU rows only, as one matrix."""
        return self.frame.values[self._gpu_index][:, columns]

    def gpu_alive(self) -> list[bool]:
        """Per GPU row: did it report any value at all? An all-NaN row is a GPU that did not answer.
        (The engine fills it for a tick's frames at once: :func:`judge_gpu_rows`.)"""
        alive = self._gpu_alive
        if alive is None:
            alive = self._gpu_alive = _alive(self.frame.values[self._gpu_index]).tolist()
        return alive

    def gpu_positive(self, metrics: tuple[str, ...]) -> list[bool]:
        """Per GPU row: is any of ``metrics`` above zero (NaN is not)? All False for a frame that
        has none of them. (The engine fills it for a tick's frames at once for the tuples its
        detectors name in :attr:`~gpuscope.detect.base.Detector.gpu_tests`.)"""
        known = self._gpu_positive
        flags = None if known is None else known.get(metrics)
        if flags is None:
            columns = [j for m in metrics if (j := self._columns.get(m)) is not None]
            flags = _positive(self.frame.values[self._gpu_index], columns).tolist()
            if known is None:
                known = self._gpu_positive = {}
            known[metrics] = flags
        return flags


def _alive(rows: FloatArray) -> BoolArray:
    """Per row: not all NaN (False for every row when there are no columns)."""
    alive = np.zeros(len(rows), bool)
    if rows.shape[1]:
        np.logical_not(np.isnan(rows).all(axis=1), out=alive)
    return alive


def _positive(rows: FloatArray, columns: list[int]) -> BoolArray:
    """Per row: is any of ``columns`` above zero (NaN > 0 is False)?"""
    if not columns:
        return np.zeros(len(rows), bool)
    out: BoolArray = np.logical_or.reduce(rows[:, columns] > 0, axis=1)
    return out


@dataclass(slots=True)
class GpuRows:
    """The GPU rows of frames sharing one metric layout, stacked: a tick's frames in one numpy pass."""

    #: the metrics of the frames stacked here (their columns, in order)
    names: tuple[str, ...]
    #: positions, in the list of frames given, of the frames stacked here (in their order)
    members: list[int]
    #: each member's first row in the stack, and one past its last
    starts: npt.NDArray[np.intp]
    ends: npt.NDArray[np.intp]
    values: FloatArray
    _columns: dict[str, int]

    def column(self, metric: str) -> FloatArray | None:
        """One metric over every stacked GPU row, or None when the layout lacks it."""
        j = self._columns.get(metric)
        return None if j is None else self.values[:, j]


@dataclass(slots=True)
class TickRows:
    """A tick's frame views, in the order they came, and their GPU rows stacked once per metric
    layout (:class:`GpuRows`, frames without GPU rows left out): the engine's row tests
    (:func:`judge_gpu_rows`), the GPU table's scatter and the detectors that take a tick's frames
    at once (:meth:`~gpuscope.detect.base.Detector.on_frames`) read the same stacks."""

    views: list[FrameView]
    blocks: list[GpuRows]
    #: per view with GPU rows, in order: its block's index in ``blocks``
    _order: list[int]

    @classmethod
    def of(cls, views: list[FrameView]) -> TickRows:
        groups: dict[tuple[str, ...], tuple[int, list[int]]] = {}
        order: list[int] = []
        for k, v in enumerate(views):
            if v.gpu_keys:  # senders' layouts differ by their entities; their metrics are often the same
                names = tuple(v.frame.metrics)
                group = groups.get(names)
                if group is None:
                    group = groups[names] = (len(groups), [])
                group[1].append(k)
                order.append(group[0])
        blocks: list[GpuRows] = []
        for names, (_, members) in groups.items():
            parts = [views[k].frame.values[views[k]._gpu_index] for k in members]
            ends = np.cumsum([len(p) for p in parts], dtype=np.intp)
            starts = np.zeros(len(parts), np.intp)
            starts[1:] = ends[:-1]
            values = parts[0] if len(parts) == 1 else np.concatenate(parts)
            blocks.append(GpuRows(names, members, starts, ends, values, views[members[0]]._columns))
        return cls(views, blocks, order)

    def runs(self) -> list[tuple[GpuRows, int, int]]:
        """The views with GPU rows in their order, cut into runs of consecutive ones sharing a
        metric layout: (their stack, the run's first member in it, one past its last). A run's rows
        are one slice of its stack, from ``starts[first]`` to ``ends[last - 1]``."""
        out: list[tuple[GpuRows, int, int]] = []
        taken = [0] * len(self.blocks)  # per block: its members in the runs so far
        start = 0
        order = self._order
        while start < len(order):
            b = order[start]
            end = start + 1
            while end < len(order) and order[end] == b:
                end += 1
            first = taken[b]
            taken[b] = first + end - start
            out.append((self.blocks[b], first, taken[b]))
            start = end
        return out


def judge_gpu_rows(tick: TickRows, positive: list[tuple[str, ...]]) -> None:
    """Fill the row tests of the tick's views (:meth:`FrameView.gpu_alive`, and
    :meth:`FrameView.gpu_positive` of each tuple in ``positive``) at once: one numpy pass per
    stack of frames sharing a metric layout, not a few numpy calls per frame. What each row's test
    says depends on that row alone, so the result is the same as frame by frame."""
    views = tick.views
    for block in tick.blocks:
        alive: list[bool] = _alive(block.values).tolist()
        flags: list[tuple[tuple[str, ...], list[bool]]] = []
        for metrics in positive:
            columns = [j for m in metrics if (j := block._columns.get(m)) is not None]
            flags.append((metrics, _positive(block.values, columns).tolist()))
        starts: list[int] = block.starts.tolist()
        ends: list[int] = block.ends.tolist()
        for k, start, end in zip(block.members, starts, ends, strict=True):
            v = views[k]
            v._gpu_alive = alive[start:end]
            if flags:
                v._gpu_positive = {metrics: rows[start:end] for metrics, rows in flags}


@dataclass(frozen=True, slots=True)
class _Roles:
    """What a frame's view derives from its entities and metrics alone (shared: never mutated)."""

    gpu_rows: list[int]
    gpu_keys: list[GpuKey]
    gpu_jobs: list[str | None]
    node_rows: dict[str, int]
    nodes: list[str]
    unplaced_gpu_rows: int
    columns: dict[str, int]
    gpu_index: slice | npt.NDArray[np.intp]

    def view(self, frame: Frame) -> FrameView:
        return FrameView(
            frame,
            self.gpu_rows,
            self.gpu_keys,
            self.gpu_jobs,
            self.node_rows,
            self.nodes,
            self.unplaced_gpu_rows,
            self.columns,
            self.gpu_index,
        )


#: roles by :attr:`Frame.layout` (a sender repeats its layout every tick), bounded as the
#: positions are
_roles: dict[int, _Roles] = {}


def _build(frame: Frame) -> FrameView:
    if frame.layout is None:
        return _roles_of(frame).view(frame)
    roles = _roles.get(frame.layout)
    if roles is None:
        if len(_roles) >= MAX_LAYOUTS:
            _roles.clear()
        roles = _roles[frame.layout] = _roles_of(frame)
    return roles.view(frame)


def _roles_of(frame: Frame) -> _Roles:
    gpu_rows: list[int] = []
    gpu_keys: list[GpuKey] = []
    gpu_jobs: list[str | None] = []
    node_rows: dict[str, int] = {}
    nodes: dict[str, None] = {}
    unplaced = 0
    for i, labels in enumerate(frame.entities):
        node = labels.get("node")
        gpu = labels.get("gpu")
        if node is None:
            unplaced += gpu is not None
            continue
        if gpu is not None:
            gpu_rows.append(i)
            gpu_keys.append((node, gpu))
            gpu_jobs.append(labels.get("job"))
            nodes[node] = None
        elif "service" not in labels:
            node_rows[node] = i
            nodes[node] = None
    n = len(gpu_rows)
    contiguous = n > 0 and gpu_rows[-1] - gpu_rows[0] == n - 1
    return _Roles(
        gpu_rows,
        gpu_keys,
        gpu_jobs,
        node_rows,
        list(nodes),
        unplaced,
        positions(frame),
        slice(gpu_rows[0], gpu_rows[0] + n) if contiguous else np.asarray(gpu_rows, np.intp),
    )


_last: tuple[Frame, FrameView] | None = None


def index(frame: Frame) -> FrameView:
    """Build the index of ``frame`` afresh and make it the one :func:`view` returns for it.

    The engine calls this once per dispatched frame, so a frame object reused with new values
    (as a benchmark may do) is never served a stale index."""
    global _last
    built = _build(frame)
    _last = (frame, built)
    return built


def select(built: FrameView) -> None:
    """Make ``built`` the index :func:`view` returns for its frame (the engine indexes a tick's
    frames first, then dispatches them one by one)."""
    global _last
    _last = (built.frame, built)


def view(frame: Frame) -> FrameView:
    """The index of ``frame``: the cached one while the same frame is passed around, else built."""
    cached = _last
    if cached is not None and cached[0] is frame:
        return cached[1]
    return index(frame)
