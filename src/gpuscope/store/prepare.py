"""Turning a :class:`Batch` into column arrays, in the caller's thread, before the writer sees it.

The writer thread is the one serial resource of the store, so everything that can run in
parallel with a commit (validation, id lookup, float32 conversion) happens here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpuscope.model import MAX_TIMESTAMP, Batch, Event, Frame, Labels, TrainingRecord
from gpuscope.store.base import AppendResult
from gpuscope.store.registry import REFUSED, ColumnRegistry, EntityRegistry

MAX_NAME_LEN = 128
MAX_NOTES = 20
#: frame layouts whose resolution is remembered at most (a fleet of agents and SDKs: one or two each)
MAX_RESOLVED = 16_384

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]


def to_ms(ts: float) -> int:
    """Seconds (epoch or simulated) to the integer milliseconds the telemetry tables store."""
    return round(ts * 1000.0)


@dataclass(frozen=True, slots=True)
class Layout:
    """How a frame's metrics map to stored columns."""

    cols: tuple[int, ...]  # stored columns, ascending
    take: npt.NDArray[np.intp] | None  # frame column feeding each stored column (None: same order)
    refused: tuple[int, ...]  # frame columns refused by the metric column limit
    pending: tuple[int, ...]  # columns not yet added to the tables


@dataclass(slots=True)
class RowBlock:
    """Telemetry rows that share one sorted set of metric columns: one INSERT statement."""

    cols: tuple[int, ...]
    ts: list[I64] = field(default_factory=list)
    entity: list[I32] = field(default_factory=list)
    attr: list[I32] = field(default_factory=list)
    values: list[F32] = field(default_factory=list)
    rows: int = 0

    def add(self, ts: I64, entity: I32, attr: I32, values: F32) -> None:
        self.ts.append(ts)
        self.entity.append(entity)
        self.attr.append(attr)
        self.values.append(values)
        self.rows += len(entity)

    def merge(self, other: RowBlock) -> None:
        self.ts.extend(other.ts)
        self.entity.extend(other.entity)
        self.attr.extend(other.attr)
        self.values.extend(other.values)
        self.rows += other.rows


@dataclass(slots=True)
class TrainingRow:
    ts: float
    job: str
    rank: int
    step: int
    labels: str
    cols: tuple[int, ...]  # training metric columns, in the order of values
    values: list[float]


@dataclass(slots=True)
class Prepared:
    """One batch, validated and converted; what the writer commits."""

    batch_id: str | None
    result: AppendResult
    blocks: dict[tuple[int, ...], RowBlock] = field(default_factory=dict)
    entities: set[int] = field(default_factory=set)  # ids used that were pending at preparation
    columns: set[int] = field(default_factory=set)
    train_columns: set[int] = field(default_factory=set)
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    training: list[TrainingRow] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.blocks.values()) + len(self.events) + len(self.training)


def _note(result: AppendResult, text: str) -> None:
    if len(result.notes) < MAX_NOTES:
        result.notes.append(text)


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LEN:
        raise ValueError(f"{where}: metric names are 1 to {MAX_NAME_LEN} character strings, got {name!r}")
    return name


_TYPE_FLOAT = frozenset({float})
_TYPE_INT = frozenset({int})
_TYPE_STR = frozenset({str})
_TYPE_DICT = frozenset({dict})


def _stamps_ok(stamps: list[float]) -> bool:
    """Every timestamp a float in 0..MAX_TIMESTAMP (what :func:`_check_ts` takes as it is)."""
    return _TYPE_FLOAT.issuperset(map(type, stamps)) and all(0.0 <= t <= MAX_TIMESTAMP for t in stamps)


def json_each(objs: list[Any], option: int) -> list[str]:
    """``orjson.dumps(o, option=option).decode()`` of each of ``objs`` (raises its TypeError).

    orjson costs about a microsecond a call on small dicts, most of it the call: a job's batch of
    128 heartbeats encodes its labels in a fraction of that as one list, cut at the commas between
    its objects. Exact when every item is a dict and the text holds no brace but their closing
    ones; otherwise (nested objects, a ``}`` in a string) each is encoded by itself.
    """
    if objs and _TYPE_DICT.issuperset(map(type, objs)):
        text = orjson.dumps(objs, option=option).decode()
        if text.count("}") == len(objs):
            return text[1:-1].replace("},{", "}\0{").split("\0")
    return [orjson.dumps(o, option=option).decode() for o in objs]


def _check_ts(ts: object, where: str) -> float:
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts <= MAX_TIMESTAMP:
        raise ValueError(f"{where}: timestamps are seconds in 0..{MAX_TIMESTAMP:.0f}, got {ts!r}")
    return float(ts)


class Preparer:
    """Converts batches using the shared registries; thread-safe (the registries lock)."""

    def __init__(
        self, entities: EntityRegistry, columns: ColumnRegistry, train_columns: ColumnRegistry
    ) -> None:
        self.entities = entities
        self.columns = columns
        self.train_columns = train_columns
        self._layouts: dict[tuple[str, ...], Layout] = {}
        self._train_layouts: dict[tuple[str, ...], Layout] = {}
        #: by :attr:`Frame.layout`: the layout and the entities' ids and attribution codes
        #: (read-only) it resolved to once none of them was pending or refused; a sender repeats
        #: its layout every tick, and a changed entity list or metric list is another number
        self._resolved: dict[int, tuple[Layout, I32, I32]] = {}

    def prepare(self, batch: Batch) -> Prepared:
        out = Prepared(batch_id=batch.batch_id, result=AppendResult())
        # values beyond float32's range become inf in the conversion and are counted as refused
        # (no warning); one errstate for the batch, not one a frame (each costs microseconds)
        with np.errstate(over="ignore", invalid="ignore"):
            for i, frame in enumerate(batch.frames):
                self._frame(frame, f"frames[{i}]", out)
        if batch.events:
            out.events = self._events(batch.events)
        out.result.events = len(out.events)
        if batch.training:
            out.training = self._trainings(batch.training, out)
        out.result.training = len(out.training)
        return out

    def _layout(self, metrics: list[str], where: str) -> Layout:
        """Where a frame's metric columns go; cached per metric list (senders repeat theirs)."""
        key = tuple(metrics)
        layout = self._layouts.get(key)
        if layout is not None:
            if layout.pending:  # refresh once the writer has stored the new columns
                pending = self.columns.still_pending(layout.pending)
                if len(pending) < len(layout.pending):
                    layout = self._layouts[key] = replace(layout, pending=pending)
            return layout
        names = [_check_name(m, f"{where}.metrics[{j}]") for j, m in enumerate(metrics)]
        if len(set(names)) != len(names):
            raise ValueError(f"{where}.metrics: names a metric twice")
        cols, new_cols = self.columns.resolve(names)
        kept = sorted((c, j) for j, c in enumerate(cols) if c != REFUSED)
        take = [j for _, j in kept]
        layout = Layout(
            cols=tuple(c for c, _ in kept),
            take=None if take == list(range(len(cols))) else np.asarray(take, dtype=np.intp),
            refused=tuple(j for j, c in enumerate(cols) if c == REFUSED),
            pending=tuple(new_cols),
        )
        if len(self._layouts) > 10_000:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout

    def _frame(self, frame: Frame, where: str, out: Prepared) -> None:
        ts = _check_ts(frame.ts, f"{where}.ts")
        known = None if frame.layout is None else self._resolved.get(frame.layout)
        layout = self._layout(frame.metrics, where) if known is None else known[0]
        values = np.asarray(frame.values, dtype=np.float64)
        if values.shape != (len(frame.entities), len(frame.metrics)):
            raise ValueError(
                f"{where}.values: shape {values.shape} does not match "
                f"{len(frame.entities)} entities x {len(frame.metrics)} metrics"
            )
        if not frame.entities or not frame.metrics:
            return
        result = out.result
        if layout.refused:
            result.refused_samples += int(np.count_nonzero(~np.isnan(values[:, list(layout.refused)])))
            names = ", ".join(frame.metrics[j] for j in layout.refused[:5])
            _note(result, f"{where}: metric column limit ({self.columns.limit}) reached, refused {names}")
        if not layout.cols:
            return
        sub = values if layout.take is None else values[:, layout.take]
        refused: list[Labels]
        pending_ids: list[int]
        if known is not None:
            ids, codes, refused, pending_ids = known[1], known[2], [], []
        else:
            ids, codes, refused, pending_ids = self.entities.resolve(frame.entities)
            if frame.layout is not None and not (refused or pending_ids or layout.pending):
                self._remember(frame.layout, layout, ids, codes)
        if refused:
            ok = ids != REFUSED
            result.refused_entities += len(refused)
            result.refused_samples += int(np.count_nonzero(~np.isnan(sub[~ok])))
            _note(
                result,
                f"{where}: entity limit ({self.entities.max_entities}) reached, "
                f"refused {len(refused)} label set(s) such as {refused[0]}",
            )
            ids, codes, sub = ids[ok], codes[ok], sub[ok]
            if len(ids) == 0:
                return
        f32 = sub.astype(np.float32)  # under prepare's errstate
        present = np.isfinite(f32)  # values too large for float32 became inf
        # counts and ufunc reductions rather than ``ndarray.any``/``all``, whose Python wrappers
        # cost several times more on a node's frame; one count serves the check and the result
        n_present = int(np.count_nonzero(present))
        if n_present != present.size:
            # what is not finite is NaN (not reported, NaN in both) or was infinite or too large
            n_bad = present.size - n_present - int(np.count_nonzero(np.isnan(f32)))
            if n_bad:
                result.refused_samples += n_bad
                _note(result, f"{where}: refused {n_bad} value(s) that are infinite or beyond float32 range")
                f32[~present & ~np.isnan(sub)] = np.nan
            rows_with_data = np.logical_or.reduce(present, axis=1)
            if np.count_nonzero(rows_with_data) != len(rows_with_data):
                ids, codes, f32 = ids[rows_with_data], codes[rows_with_data], f32[rows_with_data]
                if len(ids) == 0:
                    return
        result.samples += n_present  # rows dropped above had no value present
        block = out.blocks.get(layout.cols)
        if block is None:
            block = out.blocks[layout.cols] = RowBlock(layout.cols)
        stamps = np.empty(len(ids), dtype=np.int64)
        stamps.fill(to_ms(ts))  # np.full's Python wrapper costs more than the array
        block.add(stamps, ids, codes, f32)
        out.entities.update(pending_ids)
        out.columns.update(layout.pending)

    def _remember(self, number: int, layout: Layout, ids: I32, codes: I32) -> None:
        ids.flags.writeable = False  # shared by every later frame of this layout
        codes.flags.writeable = False
        if len(self._resolved) >= MAX_RESOLVED:  # senders come and go: start afresh
            self._resolved.clear()
        self._resolved[number] = (layout, ids, codes)

    def _events(self, events: list[Event]) -> list[tuple[float, str, str, str]]:
        """The rows of a batch's events: checked and encoded as one list (a job's batch carries a
        heartbeat a rank), each by itself only when something is refused, to name it."""
        stamps = [e.ts for e in events]
        kinds = [e.kind for e in events]
        if _stamps_ok(stamps) and _TYPE_STR.issuperset(map(type, kinds)) and "" not in kinds:
            try:
                labels = json_each([e.labels for e in events], orjson.OPT_SORT_KEYS)
                data = json_each([e.data for e in events], orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)
            except TypeError:
                pass  # named below
            else:
                return list(zip(stamps, kinds, labels, data, strict=True))
        return [self._event(e, f"events[{i}]") for i, e in enumerate(events)]

    def _event(self, event: Event, where: str) -> tuple[float, str, str, str]:
        ts = _check_ts(event.ts, f"{where}.ts")
        if not isinstance(event.kind, str) or not event.kind:
            raise ValueError(f"{where}.kind: must be a non-empty string, got {event.kind!r}")
        try:
            labels = orjson.dumps(event.labels, option=orjson.OPT_SORT_KEYS).decode()
            data = orjson.dumps(event.data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS).decode()
        except TypeError as exc:
            raise ValueError(f"{where}: labels and data must be JSON-serialisable ({exc})") from None
        return ts, event.kind, labels, data

    def _trainings(self, records: list[TrainingRecord], out: Prepared) -> list[TrainingRow]:
        """The rows of a batch's training records; as :meth:`_events`, checked and their labels
        encoded as one list, record by record only when something is refused."""
        ranks = [r.rank for r in records]
        steps = [r.step for r in records]
        jobs = [r.job for r in records]
        if not (
            _stamps_ok([r.ts for r in records])
            and _TYPE_STR.issuperset(map(type, jobs))
            and "" not in jobs
            and _TYPE_INT.issuperset(map(type, ranks))
            and _TYPE_INT.issuperset(map(type, steps))
            and min(ranks) >= 0
            and max(ranks) < 2**31
            and min(steps) >= -(2**63)
            and max(steps) < 2**63
        ):
            return [self._training(r, f"training[{i}]", out) for i, r in enumerate(records)]
        labels = json_each([r.labels for r in records], orjson.OPT_SORT_KEYS)
        layouts = self._train_layouts
        rows: list[TrainingRow] = []
        for i, (record, text) in enumerate(zip(records, labels, strict=True)):
            layout = layouts.get(tuple(record.metrics))
            if layout is None or layout.pending or layout.refused:
                rows.append(self._training(record, f"training[{i}]", out))
                continue
            values = list(record.metrics.values())
            if layout.take is not None:
                values = [values[j] for j in layout.take]
            rows.append(
                TrainingRow(record.ts, record.job, record.rank, record.step, text, layout.cols, values)
            )
        return rows

    def _training(self, record: TrainingRecord, where: str, out: Prepared) -> TrainingRow:
        ts = _check_ts(record.ts, f"{where}.ts")
        if not isinstance(record.job, str) or not record.job:
            raise ValueError(f"{where}.job: must be a non-empty string, got {record.job!r}")
        # the columns are INTEGER and BIGINT: refused here, not after the batch is acknowledged
        if not 0 <= record.rank < 2**31:
            raise ValueError(f"{where}.rank: must be in 0..{2**31 - 1}, got {record.rank!r}")
        if not -(2**63) <= record.step < 2**63:
            raise ValueError(f"{where}.step: must fit a 64-bit integer, got {record.step!r}")
        layout = self._train_layouts.get(tuple(record.metrics))
        if layout is None or layout.pending:
            layout = self._train_layout(record, where)
        values = list(record.metrics.values())
        if layout.refused:
            out.result.refused_samples += len(layout.refused)
            names = ", ".join(list(record.metrics)[j] for j in layout.refused[:5])
            _note(
                out.result,
                f"{where}: training metric column limit ({self.train_columns.limit}) reached, "
                f"refused {names}",
            )
        if layout.take is not None:
            values = [values[j] for j in layout.take]
        out.train_columns.update(layout.pending)
        labels = orjson.dumps(record.labels, option=orjson.OPT_SORT_KEYS).decode()
        return TrainingRow(ts, record.job, int(record.rank), int(record.step), labels, layout.cols, values)

    def _train_layout(self, record: TrainingRecord, where: str) -> Layout:
        names = [_check_name(m, f"{where}.metrics.{m}") for m in record.metrics]
        cols, new_cols = self.train_columns.resolve(names)
        kept = [(c, j) for j, c in enumerate(cols) if c != REFUSED]
        take = [j for _, j in kept]
        layout = Layout(
            cols=tuple(c for c, _ in kept),
            take=None if take == list(range(len(cols))) else np.asarray(take, dtype=np.intp),
            refused=tuple(j for j, c in enumerate(cols) if c == REFUSED),
            pending=self.train_columns.still_pending(new_cols),
        )
        if len(self._train_layouts) > 10_000:
            self._train_layouts.clear()
        self._train_layouts[tuple(record.metrics)] = layout
        return layout
