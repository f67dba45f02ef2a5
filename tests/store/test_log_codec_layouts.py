"""The ingest log's records are the same bytes whether a frame's layout JSON is made afresh or
taken from the codec's cache (by :attr:`Frame.layout`, which decoded frames carry): A/B against
the encoder before the cache, on a simulated fleet's node and SDK batches."""

from __future__ import annotations

import numpy as np
import orjson

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.model import Batch
from gpuscope.store import log_codec
from gpuscope.store.log_codec import decode, encode
from store.store_helpers import fleet_batches

_F64 = np.dtype("<f8")


def _encode_before(batch: Batch) -> bytes:
    """log_codec.encode before the layout cache (one orjson call for the whole head)."""
    frames, values = [], []
    for f in batch.frames:
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
    return b"".join([log_codec._HEAD.pack(len(head)), head, *values])


def _unwired(batch: Batch) -> Batch:
    """A decoded batch without its frame (what a record is made of when the frame was dropped:
    tests/store/test_log_wire.py holds the records of batches with theirs)."""
    batch.wire = None
    return batch


def test_records_of_decoded_frames_are_the_bytes_of_the_encoder_before_the_layout_cache() -> None:
    batches = fleet_batches(24)
    decoded = [_unwired(decode_frame(encode_frame(b))) for b in batches]
    assert all(f.layout is not None for b in decoded for f in b.frames)
    assert sum(len(b.frames) for b in decoded) > 24 * 8  # GPU and node frames, each tick
    assert any(b.training for b in decoded) and any(b.events for b in decoded)
    log_codec._layouts.clear()
    for batch in decoded:  # the first tick fills the cache, the ticks after it read it
        assert encode(batch) == _encode_before(batch)
    assert log_codec._layouts
    assert all(f.layout is None for b in batches for f in b.frames)
    for batch in batches:  # frames made in process: no layout number, no cache
        assert encode(batch) == _encode_before(batch)
    back = decode(encode(decoded[-1]))
    assert back.source == decoded[-1].source and back.batch_id == decoded[-1].batch_id
    assert [(f.ts, f.metrics, f.entities) for f in back.frames] == [
        (f.ts, f.metrics, f.entities) for f in decoded[-1].frames
    ]


def test_a_full_layout_cache_starts_afresh_and_records_stay_the_same() -> None:
    batches = [_unwired(decode_frame(encode_frame(b))) for b in fleet_batches(2)]
    log_codec._layouts.clear()
    before = log_codec._MAX_LAYOUTS
    log_codec._MAX_LAYOUTS = 3
    try:
        for batch in batches:
            assert encode(batch) == _encode_before(batch)
            assert len(log_codec._layouts) <= 3
    finally:
        log_codec._MAX_LAYOUTS = before
