"""The compact binary batch (wire format ``application/vnd.gpuscope.frame``, version 1).

The same :class:`~gpuscope.model.Batch` as the JSON of :mod:`gpuscope.ingest.payload`, laid out so
the hub decodes a node's tick with a handful of ``numpy.frombuffer`` calls instead of parsing
hundreds of numbers from text. All integers and floats are little-endian::

    magic   4 bytes  b"\\x89GSF"
    version u16      1
    flags   u16      0 (reserved)
    source  u16 length + UTF-8 bytes
    batch   u16 length + UTF-8 bytes; length 0xFFFF = no batch_id
    strings u32 count; u16[count] byte lengths; the UTF-8 strings, concatenated
    frames  u32 count, then per frame:
              f64 ts; u32 metrics; u32 entities; u32 label pairs
              u32[metrics]        string index of each metric name
              u16[entities]       labels per entity
              u32[2 * pairs]      (key, value) string indices, entity after entity
              f64[entities * metrics] values, row by row; NaN = not reported
    extras  u32 length + a JSON object {"events": [...], "training": [...]} (length 0: none)

The numeric bulk (frames) is columnar; events and training records, which are few and shaped like
documents, travel as the JSON of wire format v1 and pass the same validators. Every refusal is a
:class:`~gpuscope.ingest.payload.PayloadError` naming the field, and for a body that ends early or
points outside itself, the byte offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, count
from typing import Any

import numpy as np
import orjson

from gpuscope.ingest.payload import (
    DEFAULT_LIMITS,
    Limits,
    PayloadError,
    _name,
    _str,
    _timestamp,
    batch_to_json,
    decode_json,
    encode_batch,
    parse_batch,
    parse_extras,
    parse_labels,
)
from gpuscope.model import MAX_TIMESTAMP, Batch, Event, Frame, Labels, TrainingRecord

CONTENT_TYPE = "application/vnd.gpuscope.frame"
JSON_CONTENT_TYPE = "application/json"
#: what the hub's ingest route decodes (anything else is answered 415, which a sender reads as
#: "send JSON": see :mod:`gpuscope.agent.sender`)
CONTENT_TYPES = (JSON_CONTENT_TYPE, CONTENT_TYPE)
MAGIC = b"\x89GSF"
VERSION = 1
NO_BATCH_ID = 0xFFFF

_HEAD = struct.Struct("<4sHH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FRAME_HEAD = struct.Struct("<dIII")
_F64 = np.dtype("<f8")
_U16A = np.dtype("<u2")
_U32A = np.dtype("<u4")
_MAX_STRINGS = 1 << 20
_MAGIC_V1 = MAGIC + b"\x01\x00"
_NO_EXTRAS = b"\x00\x00\x00\x00"
_MAX_STRING_BYTES = 0xFFFF


def is_frame(body: bytes) -> bool:
    """Whether ``body`` is a binary frame (a JSON batch starts with ``{`` or whitespace)."""
    return body[:4] == MAGIC


# -- encoding ----------------------------------------------------------------------------------------


class _Strings:
    """The string table: each distinct string once, referenced by index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.encoded: list[bytes] = []

    def ref(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            raw = s.encode()
            if len(raw) > _MAX_STRING_BYTES:
                raise ValueError(
                    f"a string of {len(raw)} bytes does not fit a frame (limit {_MAX_STRING_BYTES})"
                )
            i = self.index[s] = len(self.encoded)
            self.encoded.append(raw)
        return i

    def to_bytes(self) -> bytes:
        lengths = np.fromiter((len(b) for b in self.encoded), dtype=_U16A, count=len(self.encoded))
        return _U32.pack(len(self.encoded)) + lengths.tobytes() + b"".join(self.encoded)


def _short(s: str | None) -> bytes:
    if s is None:
        return _U16.pack(NO_BATCH_ID)
    raw = s.encode()
    if len(raw) >= NO_BATCH_ID:
        raise ValueError(f"a source or batch id of {len(raw)} bytes does not fit a frame")
    return _U16.pack(len(raw)) + raw


def _extras(batch: Batch) -> bytes:
    if not batch.events and not batch.training:
        return _U32.pack(0)
    doc = batch_to_json(Batch(source="-", events=batch.events, training=batch.training))
    del doc["source"]
    raw = orjson.dumps(doc)
    return _U32.pack(len(raw)) + raw


@dataclass(frozen=True, slots=True)
class Encoded:
    """A frame body in two parts, for senders that send the same layout again and again (the
    load generator): ``head`` holds the source and batch id, ``rest`` everything after them.

    ``ts_offsets`` and ``value_offsets`` are byte offsets into ``rest`` of each frame's timestamp
    and first value, so a later tick can be made by patching them in place.
    """

    head: bytes
    rest: bytes
    ts_offsets: tuple[int, ...]
    value_offsets: tuple[int, ...]

    @property
    def body(self) -> bytes:
        return self.head + self.rest


def head(source: str, batch_id: str | None) -> bytes:
    """The first bytes of a frame: magic, version and the sender's ids."""
    return _HEAD.pack(MAGIC, VERSION, 0) + _short(source) + _short(batch_id)


def encode_parts(batch: Batch) -> Encoded:
    """Encode ``batch``; raises ``ValueError`` for a string longer than the format holds and
    ``TypeError`` for event data JSON cannot hold (as :func:`~gpuscope.ingest.payload.encode_batch`)."""
    strings = _Strings()
    blocks: list[bytes] = []
    for f in batch.frames:
        values = np.ascontiguousarray(f.values, dtype=_F64)
        if values.shape != (len(f.entities), len(f.metrics)):
            raise ValueError(f"values of shape {values.shape} for {len(f.entities)} × {len(f.metrics)}")
        metric_ids = np.fromiter((strings.ref(m) for m in f.metrics), dtype=_U32A, count=len(f.metrics))
        counts = np.fromiter((len(e) for e in f.entities), dtype=_U16A, count=len(f.entities))
        pairs = np.fromiter(
            (strings.ref(s) for e in f.entities for kv in e.items() for s in kv),
            dtype=_U32A,
            count=2 * int(counts.sum()),
        )
        blocks.append(
            _FRAME_HEAD.pack(f.ts, len(f.metrics), len(f.entities), len(pairs) // 2)
            + metric_ids.tobytes()
            + counts.tobytes()
            + pairs.tobytes()
        )
        blocks.append(values.tobytes())
    table = strings.to_bytes() + _U32.pack(len(batch.frames))
    ts_offsets: list[int] = []
    value_offsets: list[int] = []
    pos = len(table)
    for meta, values_raw in zip(blocks[::2], blocks[1::2], strict=True):
        ts_offsets.append(pos)
        value_offsets.append(pos + len(meta))
        pos += len(meta) + len(values_raw)
    rest = table + b"".join(blocks) + _extras(batch)
    return Encoded(head(batch.source, batch.batch_id), rest, tuple(ts_offsets), tuple(value_offsets))


def encode_frame(batch: Batch) -> bytes:
    """The binary frame of ``batch`` (inverse of :func:`decode_frame`)."""
    return encode_parts(batch).body


# -- decoding ----------------------------------------------------------------------------------------


class _Reader:
    """Reads a body front to back; running out of bytes names the field and the offset."""

    def __init__(self, body: bytes) -> None:
        self.view = memoryview(body)
        self.pos = 0

    def take(self, n: int, field: str) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise PayloadError(
                field, f"the frame ends at byte {len(self.view)}; {n} bytes needed from byte {self.pos}"
            )
        out = self.view[self.pos : end]
        self.pos = end
        return out

    def u16(self, field: str) -> int:
        return int(_U16.unpack(self.take(2, field))[0])

    def u32(self, field: str) -> int:
        return int(_U32.unpack(self.take(4, field))[0])

    def array(self, dtype: np.dtype[Any], count: int, field: str) -> np.ndarray[Any, Any]:
        raw = self.take(count * dtype.itemsize, field)
        return np.frombuffer(raw, dtype=dtype, count=count)

    def text(self, n: int, field: str) -> str:
        at = self.pos
        try:
            return str(self.take(n, field), "utf-8")
        except UnicodeDecodeError:
            raise PayloadError(field, f"is not valid UTF-8 (at byte {at})") from None

    def short_text(self, field: str) -> str | None:
        n = self.u16(field)
        return None if n == NO_BATCH_ID else self.text(n, field)


def _table(r: _Reader) -> bytes:
    """The string table's raw bytes (lengths and text), read but not decoded."""
    start = r.pos
    count = r.u32("strings")
    if count > _MAX_STRINGS or 2 * count > len(r.view) - r.pos:
        raise PayloadError("strings", f"{count} strings cannot fit the {len(r.view) - r.pos} bytes left")
    lengths = r.array(_U16A, count, "strings")
    r.take(int(np.add.reduce(lengths, dtype=np.int64)), "strings")  # without ndarray.sum's wrapper
    return bytes(r.view[start : r.pos])


def _strings(table: bytes) -> list[str]:
    """The strings of a table read by :func:`_table` (whose bounds it checked)."""
    (count,) = _U32.unpack_from(table)
    lengths = np.frombuffer(table, dtype=_U16A, count=count, offset=4).tolist()
    blob = table[4 + 2 * count :]
    if blob.isascii():  # byte offsets are character offsets: one decode for the whole table
        text = blob.decode("ascii")
        ends = list(accumulate(lengths))
        return [text[e - n : e] for e, n in zip(ends, lengths, strict=True)]
    out: list[str] = []
    pos = 0
    for i, n in enumerate(lengths):
        try:
            out.append(blob[pos : pos + n].decode())
        except UnicodeDecodeError:
            raise PayloadError(f"strings[{i}]", "is not valid UTF-8") from None
        pos += n
    return out


def _lookup(strings: list[str], ids: list[int], field: str) -> list[str]:
    try:
        return [strings[i] for i in ids]
    except IndexError:
        bad = next(k for k, i in enumerate(ids) if i >= len(strings))
        raise PayloadError(
            f"{field}[{bad}]", f"string {ids[bad]} is not in the table of {len(strings)}"
        ) from None


# A fleet repeats the same metric lists and entities every second: each distinct one is validated
# once and remembered (bounded, so a sender inventing names cannot grow the hub's memory).
@lru_cache(maxsize=1024)
def _valid_metrics(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_check_metrics(list(names), "metrics"))


def _check_metrics(names: list[str], field: str) -> list[str]:
    metrics = [_name(m, f"{field}[{j}]") for j, m in enumerate(names)]
    if len(set(metrics)) != len(metrics):
        raise PayloadError(field, "names a metric twice")
    return metrics


@lru_cache(maxsize=16_384)
def _valid_labels(pairs: tuple[str, ...], limits: Limits) -> Labels:
    return _check_labels(pairs, "entity", limits)


def _check_labels(pairs: tuple[str, ...], field: str, limits: Limits) -> Labels:
    raw: dict[str, str] = {}
    for k in range(0, len(pairs), 2):
        if pairs[k] in raw:
            raise PayloadError(f"{field}.{pairs[k]}", "is given twice")
        raw[pairs[k]] = pairs[k + 1]
    return parse_labels(raw, field, limits)


#: a frame's layout (its metric names and entities: all but its timestamp and values) by the string
#: table and bytes that encode it and the limits it was checked under. An agent sends the same
#: layout every second, so its decode is a lookup; bounded (cleared when full), so a sender
#: inventing layouts cannot grow the hub's memory.
_LayoutKey = tuple[bytes, bytes, int, int, int, Limits]
#: metric names, entities, and the layout's number (:attr:`Frame.layout`)
_Layout = tuple[tuple[str, ...], tuple[Labels, ...], int]
#: layout numbers, never reused (not even once the cache is cleared), so a number names one layout
_numbers = count()
_MAX_LAYOUTS = 4096
_layouts: dict[_LayoutKey, _Layout] = {}
#: string tables by their bytes, bounded the same way
_MAX_TABLES = 1024
_tables: dict[bytes, list[str]] = {}


def _strings_of(table: bytes) -> list[str]:
    strings = _tables.get(table)
    if strings is None:
        strings = _strings(table)
        if len(_tables) >= _MAX_TABLES:
            _tables.clear()
        _tables[table] = strings
    return strings


def _frame(r: _Reader, table: bytes, strings: list[str], field: str, limits: Limits) -> Frame:
    ts_raw, n_metrics, n_entities, n_pairs = _FRAME_HEAD.unpack(r.take(_FRAME_HEAD.size, field))
    # the usual timestamp passes without the checks that name what is wrong (NaN fails both)
    ts = ts_raw if 0.0 <= ts_raw <= MAX_TIMESTAMP else _timestamp(ts_raw, f"{field}.ts")
    if n_metrics > limits.max_metrics_per_frame:
        raise PayloadError(
            f"{field}.metrics", f"{n_metrics} items is over the limit of {limits.max_metrics_per_frame}"
        )
    if n_entities > limits.max_entities_per_frame:
        raise PayloadError(
            f"{field}.entities", f"{n_entities} items is over the limit of {limits.max_entities_per_frame}"
        )
    size = 4 * n_metrics + 2 * n_entities + 8 * n_pairs
    layout: _Layout | None = None
    key: _LayoutKey | None = None
    if r.pos + size <= len(r.view):  # else the checked path below names the field cut short
        key = (table, bytes(r.view[r.pos : r.pos + size]), n_metrics, n_entities, n_pairs, limits)
        layout = _layouts.get(key)
    if layout is None:
        layout = _layout(r, strings, field, limits, n_metrics, n_entities, n_pairs)
        if key is not None:
            if len(_layouts) >= _MAX_LAYOUTS:
                _layouts.clear()
            _layouts[key] = layout
    else:
        r.pos += size
    metrics, entities, number = layout
    values = r.array(_F64, n_entities * n_metrics, f"{field}.values").reshape(n_entities, n_metrics).copy()
    infinite = np.isinf(values)
    if np.count_nonzero(infinite):  # ndarray.any's Python wrapper costs more than the count
        row, col = (int(x) for x in np.argwhere(infinite)[0])
        raise PayloadError(f"{field}.values[{row}][{col}]", "must be finite (NaN = not reported)")
    # fresh containers: whoever receives the batch owns them
    return Frame(ts, list(metrics), [dict(e) for e in entities], values, layout=number)


def _layout(
    r: _Reader, strings: list[str], field: str, limits: Limits, n_metrics: int, n_entities: int, n_pairs: int
) -> _Layout:
    """Read and check a frame's metric names and entities, naming the first bad field."""
    names = _lookup(strings, r.array(_U32A, n_metrics, f"{field}.metrics").tolist(), f"{field}.metrics")
    try:
        metrics = _valid_metrics(tuple(names))
    except PayloadError:
        metrics = tuple(_check_metrics(names, f"{field}.metrics"))  # raises, naming the field
    counts = r.array(_U16A, n_entities, f"{field}.entities").tolist()
    if sum(counts) != n_pairs:
        raise PayloadError(f"{field}.entities", f"labels per entity add up to {sum(counts)}, not {n_pairs}")
    flat = _lookup(strings, r.array(_U32A, 2 * n_pairs, f"{field}.entities").tolist(), f"{field}.entities")
    entities: list[Labels] = []
    pos = 0
    for i, n in enumerate(counts):
        pairs = tuple(flat[pos : pos + 2 * n])
        pos += 2 * n
        try:
            entities.append(_valid_labels(pairs, limits))
        except PayloadError:
            entities.append(_check_labels(pairs, f"{field}.entities[{i}]", limits))  # raises, naming it
    return metrics, tuple(entities), next(_numbers)


def _extras_of(r: _Reader, limits: Limits, logged: bool) -> tuple[list[Event], list[TrainingRecord]]:
    n = r.u32("extras")
    if not n:
        return [], []
    doc = decode_json(bytes(r.take(n, "extras")), limits)
    if not isinstance(doc, dict) or (not logged and set(doc) - {"events", "training"}):
        raise PayloadError("extras", "must be a JSON object of 'events' and 'training'")
    # the JSON path's checks, bounds and field names, on just these two lists
    return parse_extras(doc.get("events", []), doc.get("training", []), limits, checked=not logged)


def _known(body: bytes, limits: Limits, logged: bool) -> Batch | None:
    """The batch of a body whose string table and frame layouts were all seen before (an agent's
    every tick after its first), read in place with the checks of :func:`_checked`; None as soon
    as anything is not so (unknown, cut short or refused), for :func:`_checked` to decode afresh
    and name the field. Its batch is the one :func:`_checked` makes of the same body."""
    size = len(body)
    if size < 12 or not body.startswith(_MAGIC_V1):
        return None
    (n,) = _U16.unpack_from(body, 8)
    pos = 10 + n
    if n == NO_BATCH_ID or pos + 2 > size:
        return None
    raw = body[10:pos]
    if not raw.isascii():  # a name in UTF-8 beyond ASCII is read by the checked path
        return None
    source = raw.decode("ascii")
    if not source or len(source) > limits.max_source_len:
        return None
    (n,) = _U16.unpack_from(body, pos)
    batch_id: str | None = None
    if n == NO_BATCH_ID:
        pos += 2
    else:
        raw = body[pos + 2 : pos + 2 + n]
        pos += 2 + n
        if not raw.isascii() or not 0 < n <= 128 or pos > size:
            return None
        batch_id = raw.decode("ascii")
    if pos + 4 > size:
        return None
    (count,) = _U32.unpack_from(body, pos)
    if count > _MAX_STRINGS or pos + 4 + 2 * count > size:
        return None
    end = pos + 4 + 2 * count + int(np.add.reduce(np.frombuffer(body, _U16A, count, pos + 4), dtype=np.int64))
    if end + 4 > size:
        return None
    table = body[pos:end]
    if table not in _tables:
        return None
    (n_frames,) = _U32.unpack_from(body, end)
    if n_frames > limits.max_frames:
        return None
    pos = end + 4
    frames: list[Frame] = []
    for _ in range(n_frames):
        if pos + _FRAME_HEAD.size > size:
            return None
        ts, n_metrics, n_entities, n_pairs = _FRAME_HEAD.unpack_from(body, pos)
        pos += _FRAME_HEAD.size
        meta = pos + 4 * n_metrics + 2 * n_entities + 8 * n_pairs
        values_end = meta + 8 * n_entities * n_metrics
        if not 0.0 <= ts <= MAX_TIMESTAMP or values_end > size:
            return None
        layout = _layouts.get((table, body[pos:meta], n_metrics, n_entities, n_pairs, limits))
        if layout is None:  # within the limits: checked when the layout was remembered
            return None
        values = np.frombuffer(body, _F64, n_entities * n_metrics, meta).reshape(n_entities, n_metrics).copy()
        if np.count_nonzero(np.isinf(values)):
            return None
        metrics, entities, number = layout
        frames.append(Frame(ts, list(metrics), [dict(e) for e in entities], values, layout=number))
        pos = values_end
    if pos + 4 > size:
        return None
    events: list[Event] = []
    training: list[TrainingRecord] = []
    if body[pos : pos + 4] == _NO_EXTRAS:
        pos += 4
    else:  # events and training records: their own checks, whose refusals the checked path repeats
        r = _Reader(body)
        r.pos = pos
        events, training = _extras_of(r, limits, logged)
        pos = r.pos
    if pos != size:
        return None
    return Batch(source=source, frames=frames, events=events, training=training, batch_id=batch_id, wire=body)


def decode_frame(body: bytes, limits: Limits = DEFAULT_LIMITS, *, logged: bool = False) -> Batch:
    """Decode and validate a binary frame; raise :class:`PayloadError` naming the first bad field.

    ``logged``: the body is an ingest-log record, validated when the hub (or its ingest worker)
    took it: its events and training records are built without their checks
    (:func:`~gpuscope.ingest.payload.parse_extras` unchecked); the frames are checked as ever."""
    if len(body) > limits.max_body_bytes:
        raise PayloadError("body", f"{len(body)} bytes is over the limit of {limits.max_body_bytes}")
    body = bytes(body)
    batch = _known(body, limits, logged)
    return _checked(body, limits, logged) if batch is None else batch


def _checked(body: bytes, limits: Limits, logged: bool = False) -> Batch:
    """:func:`decode_frame` field by field, remembering the string table and layouts it reads."""
    r = _Reader(body)
    magic, version, _flags = _HEAD.unpack(r.take(_HEAD.size, "header"))
    if magic != MAGIC:
        raise PayloadError("header", f"does not start with the frame magic {MAGIC!r}")
    if version != VERSION:
        raise PayloadError("version", f"frame version {version} is not supported (this hub reads {VERSION})")
    source = r.short_text("source")
    source = _str(source, "source", limits.max_source_len)
    batch_id = r.short_text("batch_id")
    if batch_id is not None:
        batch_id = _str(batch_id, "batch_id", 128)
    table = _table(r)
    strings = _strings_of(table)
    n_frames = r.u32("frames")
    if n_frames > limits.max_frames:
        raise PayloadError("frames", f"{n_frames} items is over the limit of {limits.max_frames}")
    frames = [_frame(r, table, strings, f"frames[{i}]", limits) for i in range(n_frames)]
    events, training = _extras_of(r, limits, logged)
    if r.pos != len(body):
        raise PayloadError("body", f"{len(body) - r.pos} bytes after the end of the frame (at byte {r.pos})")
    return Batch(source=source, frames=frames, events=events, training=training, batch_id=batch_id, wire=body)


def decode_body(content_type: str, body: bytes, limits: Limits = DEFAULT_LIMITS) -> Batch:
    """The one decoding entry of the ingest route: a JSON batch or a binary frame, validated.

    ``content_type`` is the media type without parameters; the route answers 415 for one not in
    :data:`CONTENT_TYPES` before reading the body.
    """
    if content_type == CONTENT_TYPE:
        return decode_frame(body, limits)
    if content_type == JSON_CONTENT_TYPE:
        return parse_batch(decode_json(body, limits), limits)
    raise PayloadError("content-type", f"{content_type!r} is not one of {', '.join(CONTENT_TYPES)}")


def frame_to_json(body: bytes) -> bytes:
    """The JSON batch of a frame body, for a hub that does not read frames (it answered 415)."""
    return encode_batch(decode_frame(body))
