"""A validated :class:`Batch` as the bytes of one ingest-log record, and back.

Only batches the store has already validated and prepared are encoded, so decoding trusts its
input (a record is checksummed by the log). Names, labels and timestamps travel as JSON; frame
values and training metrics as raw float64, so NaN and ±Inf come back exactly as they were sent.
"""

from __future__ import annotations

import struct

import numpy as np
import orjson

from gpuscope.model import Batch, Event, Frame, TrainingRecord

_HEAD = struct.Struct("<I")  # length of the JSON part
_F64 = np.dtype("<f8")


def encode(batch: Batch) -> bytes:
    frames, values = [], []
    for f in batch.frames:
        # validated: values are len(entities) x len(metrics)
        frames.append((f.ts, f.metrics, f.entities, len(f.entities), len(f.metrics)))
        values.append(np.ascontiguousarray(f.values, dtype=_F64).tobytes())
    training = []
    for t in batch.training:
        training.append((t.ts, t.job, t.rank, t.step, list(t.metrics), t.labels))
        values.append(np.fromiter(t.metrics.values(), dtype=_F64, count=len(t.metrics)).tobytes())
    head = orjson.dumps(
        {
            "s": batch.source,
            "b": batch.batch_id,
            "f": frames,
            "e": [(e.ts, e.kind, e.labels, e.data) for e in batch.events],
            "t": training,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    return b"".join([_HEAD.pack(len(head)), head, *values])


def decode(data: bytes) -> Batch:
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
