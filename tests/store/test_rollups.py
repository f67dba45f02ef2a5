"""Rollups, sealing and retention: what series and aggregates read once raw rows age."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.errors import StoreError
from store.store_helpers import fill, frame, gpu

HOUR = 3600


@pytest.fixture
def two_hours(tmp_path: Path) -> DuckDBStore:
    store = DuckDBStore(
        str(tmp_path / "r.duckdb"), durable=False, raw_retention_s=HOUR, rollup_1m_retention_s=3 * HOUR
    )
    fill(store, 0, 2 * HOUR)
    return store


def test_rollups_feed_long_range_series(two_hours: DuckDBStore) -> None:
    store = two_hours
    report = store.rollup(2 * HOUR + 70)
    assert report["minute_ranges"] == 1 and report["hour_ranges"] == 1
    rows = store.stats()["rows"]
    assert rows["rollup_1m"] == 2 * 120 and rows["rollup_1h"] == 2 * 2
    hourly = store.series("util", {"gpu": "0"}, 0, 2 * HOUR - 1, points=2)
    assert [(p.ts, p.value) for p in hourly] == [(0.0, 1799.5), (3600.0, 5399.5)]
    minutely = store.series("util", {"gpu": "1"}, 0, 2 * HOUR - 1, points=120)
    assert len(minutely) == 120
    assert minutely[5].ts == 300.0 and minutely[5].value == pytest.approx(300 + 29.5 + 1)
    store.close()


def test_rollup_is_idempotent(two_hours: DuckDBStore) -> None:
    store = two_hours
    store.rollup(2 * HOUR + 70)
    before = store.series("util", {"gpu": "0"}, 0, 2 * HOUR - 1, points=120), store.stats()["rows"]
    again = store.rollup(2 * HOUR + 70)
    assert again["minute_ranges"] == 0
    assert (store.series("util", {"gpu": "0"}, 0, 2 * HOUR - 1, points=120), store.stats()["rows"]) == before
    store.close()


def test_late_rows_are_folded_into_rolled_up_buckets(two_hours: DuckDBStore) -> None:
    store = two_hours
    store.rollup(2 * HOUR + 70)
    store.append(Batch("late", frames=[frame(30.5, ["util"], [gpu("n0", 0)], [[100_000.0]])]))
    store.rollup(2 * HOUR + 80)
    store.compact(2 * HOUR + 80)  # raw rows of the first hour are gone: only rollups can answer
    (first_minute, *_) = store.series("util", {"gpu": "0"}, 0, 2 * HOUR - 1, points=120)
    assert first_minute.value == pytest.approx((sum(range(60)) + 100_000) / 61)
    (first_hour, _) = store.series("util", {"gpu": "0"}, 0, 2 * HOUR - 1, points=2)
    assert first_hour.value == pytest.approx((sum(range(HOUR)) + 100_000) / (HOUR + 1))
    store.close()


def test_retention_keeps_answers_from_rollups(two_hours: DuckDBStore) -> None:
    store = two_hours
    exact = store.aggregate("util", "gpu", 0, 2 * HOUR - 1)
    store.rollup(2 * HOUR)
    report = store.compact(2 * HOUR)
    assert (report["samples"], report["sealed_rows"], report["chunk_files"]) == (0, 2 * HOUR, 1)
    assert store.stats()["raw_rows"] == 2 * HOUR  # second hour, both GPUs
    assert store.aggregate("util", "gpu", 0, 2 * HOUR - 1) == exact
    # a fine-grained request for deleted raw data is answered at rollup resolution
    old = store.series("util", {"gpu": "0"}, 0, 600, points=600)
    assert [p.ts for p in old] == [60.0 * k for k in range(10)]
    recent = store.series("util", {"gpu": "0"}, HOUR, HOUR + 9, points=600)
    assert [p.value for p in recent] == [float(t) for t in range(HOUR, HOUR + 10)]
    store.close()


def test_rollup_retention_falls_back_to_hours(tmp_path: Path) -> None:
    store = DuckDBStore(
        str(tmp_path / "r.duckdb"), durable=False, raw_retention_s=HOUR, rollup_1m_retention_s=HOUR
    )
    fill(store, 0, 3 * HOUR, n_gpus=1)
    store.rollup(3 * HOUR)  # minutes closed up to 10740 s, hours up to 7200 s
    store.compact(3 * HOUR)
    rows = store.stats()["rows"]
    assert rows["rollup_1m"] == 59 and rows["rollup_1h"] == 2
    hourly = store.series("util", {}, 0, 3 * HOUR - 1, points=3)
    assert [p.value for p in hourly] == [1799.5, 5399.5, 8999.5]
    assert store.aggregate("util", "node", 0, 3 * HOUR - 1)[0]["count"] == 3 * HOUR
    store.close()


def test_sealing_moves_closed_hours_to_parquet_ordered_by_entity(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    store = DuckDBStore(str(path), durable=False)
    fill(store, 0, HOUR + 120, n_gpus=3)
    report = store.rollup(HOUR + 120)
    assert report["sealed_rows"] == 3 * HOUR
    stats = store.stats()
    assert (stats["rows"]["samples"], stats["raw_rows"], stats["chunk_files"]) == (
        3 * 120,
        3 * (HOUR + 120),
        1,
    )
    assert stats["disk_bytes"] >= stats["chunk_bytes"] > 0
    assert store.rollup(HOUR + 120)["sealed_rows"] == 0
    points = store.series("util", {"gpu": "2"}, 0, HOUR + 119, points=10_000)
    assert [p.value for p in points] == [float(t + 2) for t in range(HOUR + 120)]
    store.close()
    (chunk,) = (tmp_path / "r.duckdb.chunks").iterdir()
    con = duckdb.connect()
    rows = con.execute(f"SELECT entity, ts FROM read_parquet('{chunk}')").fetchall()
    con.close()
    assert rows == sorted(rows) and len(rows) == 3 * HOUR
    with DuckDBStore(str(path)) as again:
        assert again.aggregate("util", "gpu", 0, HOUR + 119)[2]["count"] == HOUR + 120
        assert again.snapshot()[2] == {
            "labels": gpu("n0", 2),
            "ts": HOUR + 119.0,
            "values": {"util": HOUR + 121.0},
        }


def test_late_rows_for_a_sealed_hour_are_sealed_again(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "r.duckdb"), durable=False, seal_interval_s=600) as store:
        fill(store, 0, HOUR + 120, n_gpus=1)
        store.rollup(HOUR + 120)
        store.append(Batch("late", frames=[frame(10.5, ["util"], [gpu("n0", 0)], [[-1.0]])]))
        report = store.rollup(HOUR + 130)
        assert (report["sealed_rows"], report["merged_files"]) == (1, 2)  # the hour's one piece + it
        assert store.stats()["chunk_files"] == 1
        points = store.series("util", {}, 10, 11, points=100)
        assert [(p.ts, p.value) for p in points] == [(10.0, 10.0), (10.5, -1.0), (11.0, 11.0)]


def test_a_new_metric_reads_as_missing_from_older_chunks(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "r.duckdb"), durable=False) as store:
        fill(store, 0, HOUR + 120, n_gpus=1)
        store.rollup(HOUR + 120)
        store.append(
            Batch("s", frames=[frame(HOUR + 200.0, ["util", "power"], [gpu("n0", 0)], [[1.0, 300.0]])])
        )
        assert [p.value for p in store.series("power", {}, 0, HOUR + 300)] == [300.0]
        store.rollup(2 * HOUR + 120)
        assert store.aggregate("power", "gpu", 0, 2 * HOUR)[0]["count"] == 1
        assert store.aggregate("util", "gpu", 0, 2 * HOUR)[0]["count"] == HOUR + 121


def test_unregistered_chunk_files_are_removed_and_missing_ones_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    with DuckDBStore(str(path), durable=False) as store:
        fill(store, 0, HOUR + 120, n_gpus=1)
        store.rollup(HOUR + 120)
    chunks = tmp_path / "r.duckdb.chunks"
    (chunk,) = chunks.iterdir()
    orphan = chunks / "chunk-5-6-99.parquet"  # what a seal that crashed before its commit leaves
    orphan.write_bytes(b"partial")
    DuckDBStore(str(path)).close()
    assert sorted(chunks.iterdir()) == [chunk]
    chunk.unlink()
    with pytest.raises(StoreError, match="missing"):
        DuckDBStore(str(path))


def test_rollup_of_an_empty_store_does_nothing(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "e.duckdb")) as store:
        assert store.rollup(1e9) == {
            "sealed_rows": 0,
            "merged_files": 0,
            "minute_ranges": 0,
            "hour_ranges": 0,
        }
        assert store.compact(1e9)["samples"] == 0


def test_compact_never_deletes_raw_rows_that_are_not_rolled_up(tmp_path: Path) -> None:
    with DuckDBStore(
        str(tmp_path / "c.duckdb"), durable=False, raw_retention_s=60, seal_interval_s=HOUR
    ) as store:
        fill(store, 0, 600, n_gpus=1)
        assert store.compact(10 * HOUR)["samples"] == 0
        store.rollup(300)
        assert store.compact(10 * HOUR)["samples"] == 240  # up to the rollup watermark (240 s)
        assert len(store.series("util", {}, 0, 599, points=600)) == 4 + 360


def test_epoch_timestamps_round_trip(tmp_path: Path) -> None:
    t0 = 1_700_000_000.25
    with DuckDBStore(str(tmp_path / "e.duckdb")) as store:
        for k in range(3):
            store.append(Batch("s", frames=[frame(t0 + k, ["util"], [gpu("n0", 0)], [[float(k)]])]))
        assert [p.ts for p in store.series("util", {}, t0, t0 + 2)] == [t0, t0 + 1, t0 + 2]
        store.rollup(t0 + 3600)
        assert store.aggregate("util", "gpu", t0 - 60, t0 + 60)[0]["count"] == 3


def test_queries_stay_complete_while_pieces_are_sealed_and_merged(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "r.duckdb"), durable=False, seal_interval_s=600)
    fill(store, 0, 2 * HOUR, n_gpus=2)
    counts: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                counts.append(store.aggregate("util", "node", 0, 2 * HOUR)[0]["count"])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for minute in range(10, 130, 10):
            store.rollup(minute * 60 + 80)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert errors == []
    assert store.stats()["chunk_files"] == 2  # 12 ten-minute pieces, each hour's merged into one
    assert store.counters.get("store.checkpoints_deferred") == 0
    assert counts and set(counts) == {2 * 2 * HOUR}
    store.close()


def test_expired_chunk_files_are_deleted_once_no_query_can_use_them(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "r.duckdb"), durable=False, raw_retention_s=HOUR)
    for hour in range(3):  # one chunk file per hour
        fill(store, hour * HOUR, (hour + 1) * HOUR, n_gpus=1)
        store.rollup((hour + 1) * HOUR + 120)
    fill(store, 3 * HOUR, 3 * HOUR + 120, n_gpus=1)
    chunks = tmp_path / "r.duckdb.chunks"
    assert len(list(chunks.iterdir())) == 3
    report = store.compact(3 * HOUR + 120)
    assert report["chunk_files"] == 2 and store.stats()["chunk_files"] == 1
    assert len(list(chunks.iterdir())) == 3  # hidden from queries, deleted one upkeep later
    store.compact(3 * HOUR + 130)
    assert len(list(chunks.iterdir())) == 1
    store.close()
