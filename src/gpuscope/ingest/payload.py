"""Decoding and validating ingest payloads (wire format v1).

A batch is one JSON object::

    {"source": "node-0",                 # who sent it (agent, SDK process, simulator)
     "batch_id": "node-0:1700000000:42", # optional; a retried batch with the same id is stored once
     "frames":   [{"ts": 1700000000.0,
                   "metrics": ["gpu_utilization_percent", "gpu_temp_celsius"],
                   "entities": [{"node": "node-0", "gpu": "0", "job": "llm"}],
                   "values": [[97.0, 61.0]]}],          # values[entity][metric]; null = missing,
                                                       # true/false read as 1/0 (flags)
     "events":   [{"ts": ..., "kind": "xid", "labels": {"node": "node-0", "gpu": "3"},
                   "data": {"code": 79}}],
     "training": [{"ts": ..., "job": "llm", "rank": 0, "step": 120,
                   "metrics": {"loss": 2.31, "step_seconds": 1.21},
                   "labels": {"node": "node-0", "gpu": "0"}}]}

Every rejection raises :class:`PayloadError` naming the offending field by its path
(``frames[2].values[0][5]``), so a sender can tell exactly what was wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import orjson

from gpuscope.model import LABEL_KEY_RE, MAX_TIMESTAMP, Batch, Event, Frame, Labels, TrainingRecord

NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$")


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one batch; anything larger is refused with a message naming the limit."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_frames: int = 100_000
    max_entities_per_frame: int = 100_000
    max_metrics_per_frame: int = 1_024
    max_events: int = 100_000
    max_training: int = 100_000
    max_labels: int = 32
    max_label_value_len: int = 256
    max_data_bytes: int = 16_384
    max_source_len: int = 128
    #: How far a timestamp may lie ahead of the hub's clock (agents' clocks drift by seconds, not
    #: minutes); None turns the check off. Checked by :func:`check_time_window`.
    max_future_s: float | None = 600.0
    #: How old a timestamp may be (the raw retention: older rows would be dropped at once).
    max_past_s: float | None = None


DEFAULT_LIMITS = Limits()


class PayloadError(ValueError):
    """A payload was refused; ``field`` is the path of what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def decode_json(body: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    if len(body) > limits.max_body_bytes:
        raise PayloadError("body", f"{len(body)} bytes is over the limit of {limits.max_body_bytes}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PayloadError("body", f"not valid JSON ({exc})") from None


def _finite(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PayloadError(field, f"must be a number, got {type(value).__name__}")
    f = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(f):
        raise PayloadError(field, "must be finite")
    return f


def _timestamp(value: Any, field: str) -> float:
    ts = _finite(value, field)
    if ts < 0:
        raise PayloadError(field, "must not be negative (seconds since the epoch)")
    if ts > MAX_TIMESTAMP:
        raise PayloadError(field, f"{ts:.6g} is after the year 9999: send seconds since the epoch, not ms")
    return ts


def _str(value: Any, field: str, max_len: int) -> str:
    if not isinstance(value, str):
        raise PayloadError(field, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > max_len:
        raise PayloadError(field, f"must be 1 to {max_len} characters")
    return value


def _name(value: Any, field: str) -> str:
    name = _str(value, field, 128)
    if not NAME_RE.fullmatch(name):
        raise PayloadError(field, f"{name!r} is not a valid name (letters, digits, underscores)")
    return name


def _list(value: Any, field: str, max_len: int) -> list[Any]:
    if not isinstance(value, list):
        raise PayloadError(field, f"must be a list, got {type(value).__name__}")
    if len(value) > max_len:
        raise PayloadError(field, f"{len(value)} items is over the limit of {max_len}")
    return value


def parse_labels(value: Any, field: str, limits: Limits = DEFAULT_LIMITS) -> Labels:
    if not isinstance(value, dict):
        raise PayloadError(field, f"must be an object of string labels, got {type(value).__name__}")
    if len(value) > limits.max_labels:
        raise PayloadError(field, f"{len(value)} labels is over the limit of {limits.max_labels}")
    out: Labels = {}
    for k, v in value.items():
        if not LABEL_KEY_RE.fullmatch(k):
            raise PayloadError(f"{field}.{k}", "is not a valid label name")
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise PayloadError(f"{field}.{k}", f"label values are strings, got {type(v).__name__}")
        s = str(v)
        if len(s) > limits.max_label_value_len:
            raise PayloadError(f"{field}.{k}", f"longer than {limits.max_label_value_len} characters")
        out[k] = s
    return out


_NUMBER_OR_NULL = frozenset({int, float, type(None)})


def _numbers_or_nulls(raw: list[Any], cols: int) -> bool:
    """Every row a list of ``cols`` numbers or nulls (bools, strings and the rest are refused)."""
    return all(type(r) is list and len(r) == cols for r in raw) and _NUMBER_OR_NULL.issuperset(
        map(type, chain.from_iterable(raw))
    )


def _values(value: Any, field: str, rows: int, cols: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    raw = _list(value, field, rows)
    if len(raw) != rows:
        raise PayloadError(field, f"has {len(raw)} rows for {rows} entities")
    try:
        arr = np.asarray(raw)
    except ValueError:
        arr = np.asarray(raw, dtype=object)  # ragged: found and named below
    if arr.dtype.kind in "iuf" and arr.shape == (rows, cols):
        out = arr.astype(np.float64, copy=False)
        if not np.isfinite(out).all():
            raise PayloadError(field, "values must be finite numbers or null")
        return out
    if arr.dtype == object and _numbers_or_nulls(raw, cols):
        # nulls (missing metrics) make an object array: convert at once instead of value by value
        try:
            out = np.array(raw, dtype=np.float64)  # null -> NaN
        except (OverflowError, ValueError):
            pass  # an integer beyond float range: named below
        else:
            if not np.isinf(out).any():
                return out
    out = np.full((rows, cols), np.nan)
    for i, row in enumerate(raw):
        row = _list(row, f"{field}[{i}]", cols)
        if len(row) != cols:
            raise PayloadError(f"{field}[{i}]", f"has {len(row)} values for {cols} metrics")
        for j, v in enumerate(row):
            if v is not None:
                out[i, j] = _finite(v, f"{field}[{i}][{j}]")
    return out


def parse_frame(obj: Any, field: str, limits: Limits = DEFAULT_LIMITS) -> Frame:
    if not isinstance(obj, dict):
        raise PayloadError(field, "must be an object")
    metrics = [
        _name(m, f"{field}.metrics[{j}]")
        for j, m in enumerate(_list(obj.get("metrics"), f"{field}.metrics", limits.max_metrics_per_frame))
    ]
    if len(set(metrics)) != len(metrics):
        raise PayloadError(f"{field}.metrics", "names a metric twice")
    raw_entities = _list(obj.get("entities"), f"{field}.entities", limits.max_entities_per_frame)
    entities = [parse_labels(e, f"{field}.entities[{i}]", limits) for i, e in enumerate(raw_entities)]
    values = _values(obj.get("values"), f"{field}.values", len(entities), len(metrics))
    return Frame(
        ts=_timestamp(obj.get("ts"), f"{field}.ts"), metrics=metrics, entities=entities, values=values
    )


def _check_event(obj: Any, field: str, limits: Limits) -> None:
    if not isinstance(obj, dict):
        raise PayloadError(field, "must be an object")
    data = obj.get("data", {})
    if not isinstance(data, dict):
        raise PayloadError(f"{field}.data", "must be an object")
    try:
        size = len(orjson.dumps(data))
    except TypeError as exc:  # callers in Python may pass what JSON cannot hold (ints over 64 bits)
        raise PayloadError(f"{field}.data", f"is not JSON ({exc})") from None
    if size > limits.max_data_bytes:
        raise PayloadError(f"{field}.data", f"is over the limit of {limits.max_data_bytes} bytes")
    kind = _name(obj.get("kind"), f"{field}.kind")
    if kind == "job_started" and "checkpoint_every" in data:
        every = _finite(data["checkpoint_every"], f"{field}.data.checkpoint_every")
        if every <= 0:
            raise PayloadError(f"{field}.data.checkpoint_every", "must be a positive number of seconds")
    _timestamp(obj.get("ts"), f"{field}.ts")
    parse_labels(obj.get("labels", {}), f"{field}.labels", limits)


def _check_training(obj: Any, field: str, limits: Limits) -> None:
    if not isinstance(obj, dict):
        raise PayloadError(field, "must be an object")
    rank, step = obj.get("rank"), obj.get("step")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise PayloadError(f"{field}.rank", "must be a non-negative integer")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PayloadError(f"{field}.step", "must be a non-negative integer")
    raw_metrics = obj.get("metrics", {})
    if not isinstance(raw_metrics, dict) or len(raw_metrics) > limits.max_metrics_per_frame:
        raise PayloadError(
            f"{field}.metrics", f"must be an object of at most {limits.max_metrics_per_frame} numbers"
        )
    for k, v in raw_metrics.items():
        _name(k, f"{field}.metrics.{k}")
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise PayloadError(f"{field}.metrics.{k}", f"must be a number or null, got {type(v).__name__}")
        if isinstance(v, int) and abs(v) >= 2**1023:
            raise PayloadError(f"{field}.metrics.{k}", "is beyond the range of a float")
    _timestamp(obj.get("ts"), f"{field}.ts")
    _str(obj.get("job"), f"{field}.job", limits.max_label_value_len)
    parse_labels(obj.get("labels", {}), f"{field}.labels", limits)


def _labels_of(value: dict[str, Any]) -> Labels:
    """The labels of an accepted object: integer values as strings."""
    return {k: v if type(v) is str else str(v) for k, v in value.items()}


def _events_of(raw: list[dict[str, Any]]) -> list[Event]:
    # positional: a keyword call costs a sixth more on a job's batch of a few hundred records
    return [Event(float(e["ts"]), e["kind"], _labels_of(e.get("labels", {})), e.get("data", {})) for e in raw]


def _training_of(raw: list[dict[str, Any]]) -> list[TrainingRecord]:
    nan = math.nan
    return [
        TrainingRecord(
            float(t["ts"]),
            t["job"],
            t["rank"],
            t["step"],
            # a null metric is missing (NaN); a NaN/Inf loss is a signal (loss_nan), kept as sent
            {k: nan if v is None else float(v) for k, v in t.get("metrics", {}).items()},
            _labels_of(t.get("labels", {})),
        )
        for t in raw
    ]


def parse_event(obj: Any, field: str, limits: Limits = DEFAULT_LIMITS) -> Event:
    _check_event(obj, field, limits)
    return _events_of([obj])[0]


def parse_training(obj: Any, field: str, limits: Limits = DEFAULT_LIMITS) -> TrainingRecord:
    _check_training(obj, field, limits)
    return _training_of([obj])[0]


def parse_extras(
    events: Any, training: Any, limits: Limits = DEFAULT_LIMITS, *, checked: bool = True
) -> tuple[list[Event], list[TrainingRecord]]:
    """A batch's events and training records (its ``events`` and ``training`` lists).

    ``checked``: refuse what breaks a rule, naming the first bad field (``events[3].kind``).
    Without it the lists must be ones this hub accepted before (an ingest-log record: checksummed,
    and checked against the hub's limits when it was taken): they are built without the checks,
    which cost about five times the building on a training job's batch of heartbeats and step
    records. A document that would fail a check is then not refused, and may come out different.
    """
    if checked:
        events = _list(events, "events", limits.max_events)
        training = _list(training, "training", limits.max_training)
        for i, e in enumerate(events):
            _check_event(e, f"events[{i}]", limits)
        for i, t in enumerate(training):
            _check_training(t, f"training[{i}]", limits)
    return _events_of(events), _training_of(training)


def parse_batch(obj: Any, limits: Limits = DEFAULT_LIMITS) -> Batch:
    """Validate a decoded JSON batch; raise :class:`PayloadError` naming the first bad field."""
    if not isinstance(obj, dict):
        raise PayloadError("body", "must be a JSON object")
    unknown = set(obj) - {"source", "batch_id", "frames", "events", "training"}
    if unknown:
        first = sorted(unknown)[0]
        raise PayloadError(first or "body", f"{first!r} is not a field of a batch")
    batch_id = obj.get("batch_id")
    if batch_id is not None:
        batch_id = _str(batch_id, "batch_id", 128)
    source = _str(obj.get("source"), "source", limits.max_source_len)
    frames = [
        parse_frame(f, f"frames[{i}]", limits)
        for i, f in enumerate(_list(obj.get("frames", []), "frames", limits.max_frames))
    ]
    events, training = parse_extras(obj.get("events", []), obj.get("training", []), limits)
    return Batch(source=source, batch_id=batch_id, frames=frames, events=events, training=training)


def check_time_window(batch: Batch, now: float, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse a batch with a timestamp beyond ``limits.max_future_s`` ahead of ``now`` or older
    than ``limits.max_past_s``, naming the first such field.

    Refused rather than clamped: a clamped sample would be stored at a time it was not measured,
    in the wrong hour's chunk and rollup. Skew of seconds between agents stays well inside.
    """
    lo = -math.inf if limits.max_past_s is None else now - limits.max_past_s
    hi = math.inf if limits.max_future_s is None else now + limits.max_future_s
    # field names are formatted only for a refusal: this runs on every ingest request
    stamps = (
        ("frames", [f.ts for f in batch.frames]),
        ("events", [e.ts for e in batch.events]),
        ("training", [t.ts for t in batch.training]),
    )
    for kind, times in stamps:
        for i, ts in enumerate(times):
            if ts > hi:
                raise PayloadError(
                    f"{kind}[{i}].ts",
                    f"{ts - now:.0f} s ahead of the hub's clock (limit {limits.max_future_s:.0f} s)",
                )
            if ts < lo:
                raise PayloadError(
                    f"{kind}[{i}].ts",
                    f"{now - ts:.0f} s old, older than the hub keeps raw data ({limits.max_past_s:.0f} s)",
                )


def _values_json(values: np.ndarray[Any, np.dtype[np.float64]]) -> list[list[float | None]]:
    missing = np.isnan(values)
    if not missing.any():
        return values.tolist()  # type: ignore[no-any-return]
    as_objects = values.astype(object)
    as_objects[missing] = None
    return as_objects.tolist()  # type: ignore[no-any-return]


def training_to_json(record: TrainingRecord) -> dict[str, Any]:
    """The wire form of one training record; NaN metrics (a NaN loss) travel as null."""
    return {
        "ts": record.ts,
        "job": record.job,
        "rank": record.rank,
        "step": record.step,
        "metrics": {k: (None if math.isnan(v) else v) for k, v in record.metrics.items()},
        "labels": record.labels,
    }


def batch_to_json(batch: Batch) -> dict[str, Any]:
    """The wire form of a batch (inverse of :func:`parse_batch`); NaN values become null."""
    out: dict[str, Any] = {"source": batch.source}
    if batch.batch_id is not None:
        out["batch_id"] = batch.batch_id
    if batch.frames:
        out["frames"] = [
            {"ts": f.ts, "metrics": f.metrics, "entities": f.entities, "values": _values_json(f.values)}
            for f in batch.frames
        ]
    if batch.events:
        out["events"] = [
            {"ts": e.ts, "kind": e.kind, "labels": e.labels, "data": e.data} for e in batch.events
        ]
    if batch.training:
        out["training"] = [training_to_json(t) for t in batch.training]
    return out


def encode_batch(batch: Batch) -> bytes:
    return orjson.dumps(batch_to_json(batch))
