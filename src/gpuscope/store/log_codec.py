"""A validated :class:`Batch` as the bytes of one ingest-log record, and back.

Only batches the store has already validated and prepared are encoded, so decoding trusts its
input (a record is checksummed by the log). Names, labels and timestamps travel as JSON; frame
values and training metrics as raw float64, so NaN and ±Inf come back exactly as they were sent.

A batch decoded from a binary frame (:attr:`Batch.wire`) is its record as it came: the frame
decodes to an equal batch, so the hub does not encode what the agent already encoded (an agent's
batch every second). Such a record starts with the frame's magic, which no JSON head's length
does (it would be over a gigabyte), and is decoded as a frame, under no limits: whatever limits
the hub checked it against when it took it, it was valid then.
"""

from __future__ import annotations

import struct

import numpy as np
import orjson

from gpuscope.ingest.frame import decode_frame, is_frame
from gpuscope.ingest.payload import Limits
from gpuscope.model import Batch, Event, Frame, TrainingRecord

_HEAD = struct.Struct("<I")  # length of the JSON part
_F64 = np.dtype("<f8")


#: the JSON of a decoded frame's metric names, entities and shape (all of its entry in the record
#: but its timestamp) by its layout number (:attr:`Frame.layout`): an agent repeats its layout every
#: tick, so its record is mostly made of bytes already made. Bounded: cleared when full.
_MAX_LAYOUTS = 4096
_layouts: dict[int, bytes] = {}
_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_NONE = 1 << 62
#: a logged frame was checked when it was taken: its replay refuses nothing for its size
TRUSTED = Limits(
    max_body_bytes=_NONE,
    max_frames=_NONE,
    max_entities_per_frame=_NONE,
    max_metrics_per_frame=_NONE,
    max_events=_NONE,
    max_training=_NONE,
    max_labels=_NONE,
    max_label_value_len=_NONE,
    max_data_bytes=_NONE,
    max_source_len=_NONE,
    max_future_s=None,
    max_past_s=None,
)


def _frame_json(f: Frame) -> bytes:
    """``[ts, metrics, entities, rows, cols]`` as JSON (validated: values are rows x cols)."""
    rest = None if f.layout is None else _layouts.get(f.layout)
    if rest is None:
        rest = orjson.dumps([f.metrics, f.entities, len(f.entities), len(f.metrics)], option=_NUMPY)[1:]
        if f.layout is not None:
            if len(_layouts) >= _MAX_LAYOUTS:
                _layouts.clear()
            _layouts[f.layout] = rest
    return b"[" + orjson.dumps(f.ts, option=_NUMPY) + b"," + rest


def encode(batch: Batch) -> bytes:
    if batch.wire is not None:
        return batch.wire
    values = [np.ascontiguousarray(f.values, dtype=_F64).tobytes() for f in batch.frames]
    training = []
    for t in batch.training:
        training.append((t.ts, t.job, t.rank, t.step, list(t.metrics), t.labels))
        values.append(np.fromiter(t.metrics.values(), dtype=_F64, count=len(t.metrics)).tobytes())
    # the bytes orjson makes of {"s": source, "b": batch id, "f": frames, "e": events, "t": training}
    head = b"".join(
        [
            b'{"s":',
            orjson.dumps(batch.source),
            b',"b":',
            orjson.dumps(batch.batch_id),
            b',"f":[',
            b",".join([_frame_json(f) for f in batch.frames]),
            b'],"e":',
            orjson.dumps([(e.ts, e.kind, e.labels, e.data) for e in batch.events], option=_NUMPY),
            b',"t":',
            orjson.dumps(training, option=_NUMPY),
            b"}",
        ]
    )
    return b"".join([_HEAD.pack(len(head)), head, *values])


def decode(data: bytes) -> Batch:
    if is_frame(data):
        return decode_frame(data, TRUSTED, logged=True)
    (n,) = _HEAD.unpack_from(data)
    head = orjson.loads(data[_HEAD.size : _HEAD.size + n])
    offset = _HEAD.size + n
    frames = []
    for ts, metrics, entities, rows, cols in head["f"]:
        values = np.frombuffer(data, dtype=_F64, count=rows * cols, offset=offset).reshape(rows, cols)
        offset += rows * cols * _F64.itemsize
        frames.append(Frame(ts, metrics, entities, values.astype(np.float64)))
    training = []
    for ts, job, rank, step, names, labels in head["t"]:
        values = np.frombuffer(data, dtype=_F64, count=len(names), offset=offset)
        offset += len(names) * _F64.itemsize
        metrics = dict(zip(names, values.tolist(), strict=True))
        training.append(TrainingRecord(ts, job, rank, step, metrics, labels))
    events = [Event(ts, kind, labels, ev_data) for ts, kind, labels, ev_data in head["e"]]
    return Batch(head["s"], frames=frames, events=events, training=training, batch_id=head["b"])
