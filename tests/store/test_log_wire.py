"""A batch decoded from a binary frame goes into the ingest log as the frame it came in, and comes
back from the log as the batch the JSON-headed record of before gave back (A/B, on a simulated
fleet's node and SDK batches: frames, events, training records); a store killed before its commit
replays such records into the same rows as a store that took the batches in process."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from gpuscope.hub import Hub
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.ingest.payload import Limits
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.log_codec import decode, encode
from store.store_helpers import fleet_batches


def _json_record(batch: Batch) -> bytes:
    """The record the log held for this batch before (the JSON-headed encoding)."""
    wire, batch.wire = batch.wire, None
    try:
        return encode(batch)
    finally:
        batch.wire = wire


def _same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same_batch(a: Batch, b: Batch) -> None:
    assert (a.source, a.batch_id) == (b.source, b.batch_id)
    assert len(a.frames) == len(b.frames)
    for fa, fb in zip(a.frames, b.frames, strict=True):
        assert (fa.ts, fa.metrics, fa.entities) == (fb.ts, fb.metrics, fb.entities)
        assert fa.values.dtype == fb.values.dtype == np.float64
        np.testing.assert_array_equal(fa.values, fb.values)  # NaN where NaN
    assert a.events == b.events
    assert len(a.training) == len(b.training)
    for ta, tb in zip(a.training, b.training, strict=True):
        assert (ta.ts, ta.job, ta.rank, ta.step, ta.labels) == (tb.ts, tb.job, tb.rank, tb.step, tb.labels)
        assert list(ta.metrics) == list(tb.metrics)
        assert all(_same_number(ta.metrics[m], tb.metrics[m]) for m in ta.metrics)


def test_a_decoded_frame_is_its_own_record_and_replays_as_the_record_of_before() -> None:
    batches = fleet_batches(20)
    bodies = [encode_frame(b) for b in batches]
    decoded = [decode_frame(body) for body in bodies]
    assert any(b.training for b in decoded) and any(b.events for b in decoded)
    assert any(np.isnan(f.values).any() for b in decoded for f in b.frames)
    for body, batch in zip(bodies, decoded, strict=True):
        record = encode(batch)
        assert record == body  # nothing encoded again
        assert_same_batch(decode(record), decode(_json_record(batch)))
        assert_same_batch(decode(record), batch)
    made_here = Batch("sdk", frames=[Frame(1.0, ["util"], [{"node": "n1"}], np.array([[math.inf]]))])
    assert made_here.wire is None and not encode(made_here).startswith(bodies[0][:4])
    assert_same_batch(decode(encode(made_here)), made_here)


def test_a_frame_taken_under_looser_limits_than_the_defaults_replays() -> None:
    wide = Batch(
        "n1",
        frames=[Frame(1.7e9, [f"m{j}" for j in range(1500)], [{"node": "n1"}], np.ones((1, 1500)))],
    )
    hub_limits = Limits(max_metrics_per_frame=2000)
    batch = decode_frame(encode_frame(wide), hub_limits)
    assert_same_batch(decode(encode(batch)), wide)  # the defaults (1,024 metrics) would refuse it


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from gpuscope.ingest.frame import decode_frame
    from gpuscope.store.duckdb import DuckDBStore

    store = DuckDBStore(sys.argv[1], flush_interval_s=3600)
    blob = open(sys.argv[2], "rb").read()
    pos = 0
    while pos < len(blob):
        n = int.from_bytes(blob[pos : pos + 4], "little")
        batch = decode_frame(blob[pos + 4 : pos + 4 + n])
        pos += 4 + n
        assert not store.append(batch).duplicate
        assert batch.wire is None  # written, not kept
    assert store.counters.get("store.commits") == 0
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_frames_only_in_the_log_at_sigkill_replay_into_the_rows_of_batches_taken_in_process(
    tmp_path: Path,
) -> None:
    batches = fleet_batches(3, nodes=4)
    bodies = [encode_frame(b) for b in batches]
    blob = tmp_path / "bodies"
    blob.write_bytes(b"".join(len(b).to_bytes(4, "little") + b for b in bodies))
    killed = tmp_path / "killed.duckdb"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(killed), str(blob)], capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    start, end = 1.7e9 - 1, 1.7e9 + 10  # the simulator's t0 and three ticks
    node = batches[0].frames[0].entities[0]["node"]
    metrics = [m for b in batches[:1] for f in b.frames for m in f.metrics]
    with DuckDBStore(str(killed)) as replayed, DuckDBStore(str(tmp_path / "direct.duckdb")) as direct:
        assert replayed.counters.get("store.log_replayed_batches") == len(bodies)
        for batch in batches:
            direct.append(batch)
        seen = 0
        for metric in metrics:
            want = direct.series(metric, {"node": node}, start, end)
            assert replayed.series(metric, {"node": node}, start, end) == want
            seen += len(want)
        assert seen > len(metrics)


def test_a_stored_batch_reaches_the_observers_without_its_frame() -> None:
    # a store without the log (the remote stores' case) never drops it: the hub does
    seen: list[Batch] = []
    hub = Hub(DuckDBStore(":memory:"))
    hub.add_observer(seen.append)
    batch = decode_frame(encode_frame(fleet_batches(1, nodes=1)[0]))
    assert batch.wire is not None
    hub.ingest(batch)
    hub.settle()
    assert len(seen) == 1 and seen[0] is batch and batch.wire is None
    hub.store.close()
