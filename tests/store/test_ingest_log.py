"""The durable store's ingest log: acknowledged before the tables hold it, and never lost or
stored twice whatever happens between the two (a SIGKILL, a torn last record, a retry)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuscope.model import Alert, Batch, Event, TrainingRecord
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.ingest_log import SUFFIX, record_crc
from gpuscope.store.log_codec import decode, encode
from store.store_helpers import frame, gpu

# Appends acknowledged batches to a store whose tick never comes, then SIGKILLs itself: the
# batches exist only in the ingest log.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from gpuscope.model import Batch, Frame
    from gpuscope.store.duckdb import DuckDBStore

    store = DuckDBStore(sys.argv[1], flush_interval_s=3600)
    for k in range(int(sys.argv[2])):
        ents = [{"node": "n1", "gpu": str(g)} for g in range(4)]
        batch = Batch("child", frames=[Frame(float(k), ["util"], ents, np.full((4, 1), float(k)))],
                      batch_id=f"b{k}")
        assert not store.append(batch).duplicate
    assert store.counters.get("store.commits") == 0
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def killed_after_appending(path: Path, batches: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(batches)], capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr


def util_points(store: DuckDBStore, end: float) -> list[tuple[float, float]]:
    return [(p.ts, p.value) for p in store.series("util", {"node": "n1", "gpu": "0"}, 0, end, points=10_000)]


def test_batches_only_in_the_log_at_sigkill_are_replayed_once(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    killed_after_appending(path, 20)
    with DuckDBStore(str(path)) as store:
        assert store.counters.get("store.log_replayed_batches") == 20
        assert util_points(store, 100) == [(float(k), float(k)) for k in range(20)]
        assert store.append(Batch("retry", batch_id="b7")).duplicate  # retried after the crash
    with DuckDBStore(str(path)) as store:  # reopened: the tables hold them, nothing is replayed again
        assert store.counters.get("store.log_replayed_batches") == 0
        assert util_points(store, 100) == [(float(k), float(k)) for k in range(20)]
        assert store.stats()["log"]["bytes"] == 0  # released once the tables held it


def test_a_torn_last_record_is_dropped_and_counted_and_earlier_records_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    killed_after_appending(path, 5)
    segments = sorted((tmp_path / "s.duckdb.log").glob(f"*{SUFFIX}"))
    with segments[-1].open("ab") as f:  # a crash in the middle of writing the next record
        f.write((1000).to_bytes(4, "little") + b"\x00" * 30)
    with DuckDBStore(str(path)) as store:
        assert store.counters.get("store.log_torn_records") == 1
        assert store.counters.get("store.log_replayed_batches") == 5
        assert util_points(store, 100) == [(float(k), float(k)) for k in range(5)]
        assert not store.append(
            Batch("next", frames=[frame(5.0, ["util"], [gpu("n1", 0)], [[5.0]])])
        ).duplicate
    with DuckDBStore(str(path)) as store:
        assert util_points(store, 100) == [(float(k), float(k)) for k in range(6)]


def test_a_duplicate_is_recognised_while_the_first_copy_is_only_in_the_log(tmp_path: Path) -> None:
    path = str(tmp_path / "s.duckdb")
    store = DuckDBStore(path, flush_interval_s=3600)
    batch = Batch("a", frames=[frame(1.0, ["util"], [gpu("n1", 0)], [[1.0]])], batch_id="once")
    assert not store.append(batch).duplicate
    assert store.counters.get("store.commits") == 0  # acknowledged, not yet in the tables
    assert store.append(batch).duplicate
    assert store.counters.get("store.duplicate_batches") == 1
    assert util_points(store, 10) == [(1.0, 1.0)]  # a read moves it into the tables first
    assert store.counters.get("store.commits") == 1
    store.close()
    with DuckDBStore(path) as again:
        assert again.append(batch).duplicate
        assert util_points(again, 10) == [(1.0, 1.0)]


def test_the_log_codec_round_trips_what_a_batch_can_hold() -> None:
    values = np.array([[1.5, math.nan], [math.inf, -2.0]])
    batch = Batch(
        "src",
        frames=[frame(10.25, ["a", "b"], [gpu("n1", 0), gpu("n1", 1, job="j")], values.tolist())],
        events=[Event(11.0, "xid", {"node": "n1"}, {"code": 79, "text": "fell off the bus"})],
        training=[TrainingRecord(12.0, "j", 3, 400, {"loss": math.nan, "grad": math.inf}, {"team": "t"})],
        batch_id="id-1",
    )
    back = decode(encode(batch))
    assert (back.source, back.batch_id) == ("src", "id-1")
    (f,) = back.frames
    assert (f.ts, f.metrics, f.entities) == (10.25, ["a", "b"], batch.frames[0].entities)
    np.testing.assert_array_equal(f.values, values)
    assert back.events == batch.events
    (t,) = back.training
    assert (t.ts, t.job, t.rank, t.step, t.labels) == (12.0, "j", 3, 400, {"team": "t"})
    assert math.isnan(t.metrics["loss"]) and t.metrics["grad"] == math.inf
    assert decode(encode(Batch("empty"))) == Batch("empty")


def test_every_tick_moves_the_log_into_the_tables_and_frees_the_segments(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with DuckDBStore(str(path), flush_interval_s=0.05) as store:
        for k in range(3):
            store.append(Batch("a", frames=[frame(float(k), ["util"], [gpu("n1", 0)], [[float(k)]])]))
        deadline = time.monotonic() + 10
        while store.counters.get("store.commits") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.counters.get("store.commits") >= 1  # by the flush thread, not by a read
    assert not list((tmp_path / "s.duckdb.log").glob(f"*{SUFFIX}"))


def test_a_rank_or_step_the_tables_cannot_hold_is_refused_before_acknowledgement(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "s.duckdb")) as store:
        for rank, step, field in ((2**31, 1, "training[0].rank"), (0, 2**63, "training[0].step")):
            record = TrainingRecord(1.0, "j", rank, step, {"loss": 1.0})
            with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
                store.append(Batch("sdk", training=[record], batch_id=f"r{rank}"))
            assert not store.append(Batch("sdk", batch_id=f"r{rank}")).duplicate  # not remembered
        assert store.counters.get("store.unstorable_batches") == 0


def wait_for(done: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def stored_columns(store: DuckDBStore) -> set[str]:
    return {str(r[0]) for r in store._con.cursor().execute("SELECT name FROM metric_columns").fetchall()}


def test_new_metric_columns_reach_the_tables_at_once_and_rows_wait_for_the_interval(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "s.duckdb"), flush_interval_s=3600) as store:
        store.append(Batch("a", frames=[frame(1.0, ["util", "temp"], [gpu("n1", 0)], [[1.0, 40.0]])]))
        assert wait_for(lambda: store.counters.get("store.column_commits") == 1)
        assert stored_columns(store) == {"util", "temp"}
        assert store.counters.get("store.commits") == 0  # the rows wait for the tick
        for k in range(2, 5):  # known columns: no early commit
            store.append(Batch("a", frames=[frame(float(k), ["util", "temp"], [gpu("n1", 0)], [[k, 40.0]])]))
        store.append(Batch("a", frames=[frame(5.0, ["power"], [gpu("n1", 0)], [[300.0]])]))
        assert wait_for(lambda: store.counters.get("store.column_commits") == 2)
        assert stored_columns(store) == {"util", "temp", "power"}
        assert store.counters.get("store.commits") == 0
        assert util_points(store, 10) == [(float(k), float(k)) for k in range(1, 5)]  # a read commits first
        assert store.counters.get("store.commits") == 1


def test_the_tick_commit_comes_after_the_interval_not_per_batch(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "s.duckdb"), flush_interval_s=2.0) as store:
        store.append(Batch("a", frames=[frame(0.0, ["util"], [gpu("n1", 0)], [[0.0]])]))
        assert wait_for(lambda: store.counters.get("store.commits") == 1)
        started = time.monotonic()
        for k in range(1, 4):
            store.append(Batch("a", frames=[frame(float(k), ["util"], [gpu("n1", 0)], [[float(k)]])]))
        in_time = time.monotonic() - started < 1.0  # well before the next tick is due
        if in_time:
            assert store.counters.get("store.commits") == 1  # acknowledged, waiting for the tick
        assert wait_for(lambda: store.counters.get("store.commits") == 2)
        time.sleep(0.2)
        if in_time:
            assert store.counters.get("store.commits") == 2  # the three in one commit
        assert store.counters.get("store.column_commits") == 1
        assert util_points(store, 10) == [(float(k), float(k)) for k in range(4)]


def test_a_store_commits_every_five_seconds_by_default(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "s.duckdb")) as store:
        assert store.flush_interval_s == 5.0


def test_reading_alerts_sees_every_saved_alert_without_committing_the_telemetry(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "s.duckdb"), flush_interval_s=3600) as store:
        store.append(Batch("a", frames=[frame(1.0, ["util"], [gpu("n1", 0)], [[1.0]])]))
        alert = Alert("a1", "gpu_xid_fatal", "P1", "hardware", {"node": "n1", "gpu": "0"}, 1.0, "XID 79", 2.5)
        store.save_alert(alert)
        assert [a.id for a in store.alerts()] == ["a1"]
        assert store.counters.get("store.commits") == 0  # the telemetry still waits for its tick
        assert util_points(store, 10) == [(1.0, 1.0)]


def test_a_records_checksum_taken_in_pieces_is_the_whole_records_crc32() -> None:
    # records written before the checksum was taken in pieces must still read as whole
    rng = np.random.default_rng(7)
    for size in (0, 1, 5 * 1024 - 1, 5 * 1024, 5 * 1024 + 1, 10 * 1024, 10 * 1024 + 3, 100_000):
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        whole = zlib.crc32(payload, zlib.crc32((12345).to_bytes(8, "little")))
        assert record_crc(12345, payload) == whole
