"""Raw rows sealed in pieces every ``seal_interval_s``, each closed hour's pieces merged into one
file: reads are exact across pieces, their boundaries and the merge, and a crash at any point of a
merge loses and duplicates nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore, chunks
from gpuscope.store.duckdb.chunks import JOIN_ROWS, SEAL_SORT_ROWS
from gpuscope.store.settings import StorageConfigError, parse_storage
from store.store_helpers import fill, frame, gpu

HOUR = 3600
PIECE = 600


def upkeep_until(store: DuckDBStore, start: int, stop: int) -> None:
    """The hub's minute upkeep from ``start`` to ``stop``, filling each minute before it runs."""
    for minute in range(start, stop, 60):
        fill(store, minute, minute + 60)
        store.rollup(minute + 60)
        store.compact(minute + 60)


def files(store: DuckDBStore) -> list[str]:
    return sorted(c.file.split("-")[0] for c in store.chunks.all())


def exact(store: DuckDBStore, lo: int, hi: int) -> None:
    """Every second in [lo, hi] of GPU 1 reads once, with its value (raw resolution)."""
    points = store.series("util", {"gpu": "1"}, lo, hi, points=hi - lo + 1)
    assert [(p.ts, p.value) for p in points] == [(float(t), float(t + 1)) for t in range(lo, hi + 1)]


def test_reads_span_pieces_their_boundaries_and_the_hot_rows(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "p.duckdb"), seal_interval_s=PIECE, durable=False) as store:
        upkeep_until(store, 0, 45 * 60)
        assert files(store) == ["chunk"] * 4  # [0, 600) ... [1800, 2400): the hot table holds the rest
        assert store.stats()["rows"]["samples"] == 2 * (45 * 60 - 2400)
        exact(store, 590, 610)  # across a piece boundary
        exact(store, 2390, 2410)  # the last piece and the hot table
        exact(store, 0, 45 * 60 - 1)
        assert store.aggregate("util", "node", 0, HOUR)[0]["count"] == 2 * 45 * 60


def test_a_closed_hour_becomes_one_file_ordered_by_entity_in_each_piece(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with DuckDBStore(str(path), seal_interval_s=PIECE, durable=False) as store:
        upkeep_until(store, 0, HOUR + 12 * 60)
        # hour 0: six pieces merged; hour 1: its first piece [3600, 4200)
        assert files(store) == ["chunk", "hour"]
        merged = next(c for c in store.chunks.all() if c.merged)
        assert (merged.lo, merged.hi, merged.rows) == (0, HOUR * 1000, 2 * HOUR)
        exact(store, HOUR - 10, HOUR + 10)  # the merged hour, the next piece
        exact(store, 0, HOUR + 12 * 60 - 1)
        upkeep_until(store, HOUR + 12 * 60, HOUR + 14 * 60)
        assert len(list((tmp_path / "p.duckdb.chunks").iterdir())) == 2  # the pieces' files are gone
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT ts // {PIECE * 1000}, entity, ts FROM read_parquet('{path}.chunks/{merged.file}')"
    ).fetchall()
    con.close()
    assert rows == sorted(rows) and len(rows) == 2 * HOUR
    with DuckDBStore(str(path)) as again:
        exact(again, 0, HOUR + 14 * 60 - 1)


def row_groups(path: Path) -> list[tuple[int, int]]:
    """(rows, first ts) of each row group of a Parquet file."""
    con = duckdb.connect()
    groups = con.execute(
        "SELECT row_group_num_rows, stats_min FROM parquet_metadata(?) "
        "WHERE path_in_schema = 'ts' ORDER BY row_group_id",
        [str(path)],
    ).fetchall()
    con.close()
    return [(int(n), int(lo)) for n, lo in groups]


def test_a_merge_writes_each_large_piece_as_one_row_group(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    n_gpus = JOIN_ROWS // PIECE + 1  # each piece holds just over JOIN_ROWS rows
    with DuckDBStore(str(path), seal_interval_s=PIECE, durable=False) as store:
        for minute in range(0, HOUR + 120, 60):
            fill(store, minute, minute + 60, n_gpus=n_gpus)
            store.rollup(minute + 70)
        merged = next(c for c in store.chunks.all() if c.merged)
        # one row group per piece (each sealed in ranges of entities), not one of the whole hour
        assert row_groups(tmp_path / "p.duckdb.chunks" / merged.file) == [
            (n_gpus * PIECE, k * PIECE * 1000) for k in range(6)
        ]
        assert merged.rows == n_gpus * HOUR
        exact(store, 0, HOUR + 59)


def test_a_piece_sealed_in_large_ranges_keeps_its_row_groups_in_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a large fleet's piece: ranges of JOIN_ROWS rows or more compress well as they are, so the
    # hour's merge joins them undecoded instead of spending CPU to write them again
    monkeypatch.setattr(chunks, "SEAL_MAX_RANGES", 2)
    path = tmp_path / "p.duckdb"
    n_gpus = 2 * JOIN_ROWS // PIECE + 1  # a piece of just over two ranges of JOIN_ROWS
    with DuckDBStore(str(path), seal_interval_s=PIECE, durable=False) as store:
        for minute in range(0, HOUR + 120, 60):
            fill(store, minute, minute + 60, n_gpus=n_gpus)
            store.rollup(minute + 70)
        merged = next(c for c in store.chunks.all() if c.merged)
        groups = row_groups(tmp_path / "p.duckdb.chunks" / merged.file)
        # each piece's two ranges of entities (52 and 51 GPUs' 600 rows), as the seal wrote them
        assert [n for n, _ in groups] == [52 * PIECE, 51 * PIECE] * 6
        assert merged.rows == n_gpus * HOUR
        exact(store, 0, HOUR + 59)


def test_small_pieces_are_merged_into_row_groups_of_a_run_of_them(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with DuckDBStore(str(path), seal_interval_s=PIECE, durable=False) as store:
        upkeep_until(store, 0, HOUR + 12 * 60)
        merged = next(c for c in store.chunks.all() if c.merged)
        # six pieces of 1,200 rows: too small to compress well alone, so one row group of all six
        assert row_groups(tmp_path / "p.duckdb.chunks" / merged.file) == [(2 * HOUR, 0)]
        assert len(list((tmp_path / "p.duckdb.chunks").iterdir())) == 2  # no run's file is left
        exact(store, 0, HOUR + 12 * 60 - 1)


def test_a_large_seal_is_sorted_a_range_of_entities_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    n_gpus = SEAL_SORT_ROWS // 60 + 100  # a minute of them: two ranges to sort
    with DuckDBStore(str(path), seal_interval_s=60, durable=False) as store:
        fill(store, 0, 120, n_gpus=n_gpus)
        store.rollup(130)  # seals [0, 60)
        (piece,) = store.chunks.all()
        assert piece.rows == 60 * n_gpus
        groups = row_groups(tmp_path / "p.duckdb.chunks" / piece.file)
        assert len(groups) == 2 and sum(n for n, _ in groups) == 60 * n_gpus
        assert len(list((tmp_path / "p.duckdb.chunks").iterdir())) == 1  # no range's file is left
        con = duckdb.connect()
        rows = con.execute(f"SELECT entity, ts FROM read_parquet('{path}.chunks/{piece.file}')").fetchall()
        con.close()
        assert rows == sorted(rows) and len(set(rows)) == len(rows)  # ordered by entity, each row once
        exact(store, 0, 119)
        assert store.aggregate("util", "node", 0, 119)[0]["count"] == 120 * n_gpus


def test_pieces_with_different_metrics_are_merged_by_decoding_them(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "p.duckdb"), seal_interval_s=PIECE, durable=False) as store:
        upkeep_until(store, 0, 30 * 60)
        power = [frame(float(t), ["power"], [gpu("n0", 0)], [[float(t)]]) for t in range(1800, HOUR)]
        store.append(Batch("test", frames=power))  # a metric that appears halfway through the hour
        upkeep_until(store, 30 * 60, HOUR + 12 * 60)
        merged = next(c for c in store.chunks.all() if c.merged)
        assert merged.rows == 2 * HOUR + 1800  # the power rows are rows of their own
        exact(store, 0, HOUR + 12 * 60 - 1)
        points = store.series("power", {"gpu": "0"}, 0, HOUR - 1, points=HOUR)
        assert [(p.ts, p.value) for p in points] == [(float(t), float(t)) for t in range(1800, HOUR)]


def test_a_hot_table_holding_hours_is_sealed_an_hour_at_a_time(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "p.duckdb"), seal_interval_s=PIECE, durable=False) as store:
        fill(store, 0, 2 * HOUR + 700)  # a hub that was down: the first upkeep finds hours of rows
        report = store.rollup(2 * HOUR + 700)
        assert report["sealed_rows"] == 2 * (2 * HOUR + 600)
        spans = sorted((c.lo, c.hi) for c in store.chunks.all())
        assert spans == [(0, HOUR * 1000), (HOUR * 1000, 2 * HOUR * 1000), (2 * HOUR * 1000, 7800 * 1000)]
        exact(store, 0, 2 * HOUR + 699)


def test_late_rows_for_a_merged_hour_are_merged_in_once_an_hour_of_pieces_waits(tmp_path: Path) -> None:
    with DuckDBStore(str(tmp_path / "p.duckdb"), seal_interval_s=PIECE, durable=False) as store:
        upkeep_until(store, 0, HOUR + 12 * 60)
        now = HOUR + 12 * 60
        for k in range(HOUR // PIECE):  # a late row for hour 0 every minute: a piece each
            store.append(Batch("late", frames=[frame(10.5 + k, ["util"], [gpu("n0", 1)], [[-1.0]])]))
            now += 60
            report = store.rollup(now)
            assert report["sealed_rows"] == 1
            hour0 = [c for c in store.chunks.all() if c.lo < HOUR * 1000]
            assert len(hour0) == (k + 2 if k + 2 <= HOUR // PIECE else 1)  # no hour rewrite per late row
        assert report["merged_files"] == HOUR // PIECE + 1
        points = store.series("util", {"gpu": "1"}, 10, 17, points=100)
        late = [(10.5 + k, -1.0) for k in range(6)]
        on_time = [(float(t), float(t + 1)) for t in range(10, 18)]
        assert [(p.ts, p.value) for p in points] == sorted(on_time + late)
        assert store.aggregate("util", "node", 0, HOUR + 12 * 60 - 1)[0]["count"] == 2 * (HOUR + 12 * 60) + 6


CRASH = textwrap.dedent(
    """
    import os, sys
    from gpuscope.store.duckdb import DuckDBStore
    from gpuscope.store.duckdb import parquet_concat
    from gpuscope.store.duckdb.chunks import ChunkSet

    where = sys.argv[2]
    real_merge, real_replaced = ChunkSet.merge, ChunkSet.replaced

    real_concat = parquet_concat.concat

    def concat(sources, target):  # dies with half of the hour's bytes written, not fsynced
        real_concat(sources, target)
        target.flush()
        target.truncate(target.tell() // 2)
        os._exit(9)

    if where == "mid-write":
        parquet_concat.concat = concat

    def merge(self, con, pieces):
        chunk = real_merge(self, con, pieces)
        if where == "before-commit":  # the merged file is written and fsynced, not registered
            os._exit(9)
        return chunk

    def replaced(self, pieces, merged):
        real_replaced(self, pieces, merged)
        if where == "after-commit":  # registered; the pieces' files are still on disk
            os._exit(9)

    ChunkSet.merge, ChunkSet.replaced = merge, replaced
    store = DuckDBStore(sys.argv[1], seal_interval_s=600)
    store.rollup(3600 + 130)
    """
)


@pytest.fixture(scope="module")
def five_pieces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store with five pieces of hour 0, its last ten minutes hot (built once: each test
    crashes its own copy)."""
    path = tmp_path_factory.mktemp("five") / "p.duckdb"
    with DuckDBStore(str(path), seal_interval_s=PIECE) as store:
        upkeep_until(store, 0, HOUR + 60)
        assert files(store) == ["chunk"] * 5
    return path


@pytest.mark.parametrize("where", ["mid-write", "before-commit", "after-commit"])
def test_a_crash_mid_merge_loses_and_duplicates_nothing(
    tmp_path: Path, where: str, five_pieces: Path
) -> None:
    path = tmp_path / "p.duckdb"
    shutil.copytree(five_pieces.parent, tmp_path, dirs_exist_ok=True)
    run = subprocess.run([sys.executable, "-c", CRASH, str(path), where], capture_output=True, text=True)
    assert run.returncode == 9, run.stderr  # it sealed the sixth piece, then died merging the hour
    on_disk = sorted(p.name.split("-")[0] for p in (tmp_path / "p.duckdb.chunks").iterdir())
    run = ["chunk"] if where == "mid-write" else []  # the six small pieces rewritten as one run
    assert on_disk == ["chunk"] * 6 + run + ["hour"]
    with DuckDBStore(str(path), seal_interval_s=PIECE) as again:
        kept = ["hour"] if where == "after-commit" else ["chunk"] * 6
        assert files(again) == kept
        assert len(list((tmp_path / "p.duckdb.chunks").iterdir())) == len(kept)  # leftovers deleted
        exact(again, 0, HOUR + 59)
        assert again.aggregate("util", "node", 0, 2 * HOUR)[0]["count"] == 2 * (HOUR + 60)
        again.rollup(HOUR + 130)  # an interrupted merge completes on the next upkeep
        assert files(again) == ["hour"]
        exact(again, 0, HOUR + 59)


@pytest.mark.parametrize("bad", [0, 59, 90, 420, 5400, "10m"])
def test_a_seal_interval_must_tile_the_hour(bad: object) -> None:
    with pytest.raises(StorageConfigError, match=r"storage\.seal_interval_s"):
        parse_storage({"seal_interval_s": bad})
    if isinstance(bad, int):
        with pytest.raises(ValueError, match="seal_interval_s"):
            DuckDBStore(seal_interval_s=bad)


def test_the_seal_interval_reaches_the_store(tmp_path: Path) -> None:
    assert parse_storage({}).seal_interval_s == 60
    assert parse_storage({"seal_interval_s": 300}).seal_interval_s == 300
    assert parse_storage({"seal_interval_s": 7200}).seal_interval_s == 7200


def wal(path: Path) -> int:
    file = path.parent / (path.name + ".wal")
    return file.stat().st_size if file.exists() else 0


def test_retention_leaves_a_small_wal_to_the_next_seal_and_checkpoints_a_large_one(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    with DuckDBStore(str(path), seal_interval_s=60, durable=False) as store:
        fill(store, 0, 90)
        store.rollup(90)
        store.compact(90)  # every minute: no checkpoint (it would rewrite the hot table's row group)
        assert wal(path) > 5_000  # 180 rows
        fill(store, 90, 200)
        kept = wal(path)
        assert kept > 10_000  # 400 rows
        store.rollup(200)  # the seal deletes the sealed rows and checkpoints
        assert store.stats()["chunk_files"] == 1 and wal(path) < 1_000  # the rollup's commit after it
    with DuckDBStore(str(path), seal_interval_s=60, durable=False, compact_checkpoint_bytes=1) as store:
        fill(store, 200, 260)
        store.compact(260)
        assert wal(path) == 0
        exact(store, 0, 259)


def _hot_table(store: DuckDBStore) -> tuple[int, int]:
    """The hot table's identity and the database's used blocks."""
    cur = store._cursor()
    oid = cur.execute("SELECT table_oid FROM duckdb_tables() WHERE table_name = 'samples'").fetchone()
    used = cur.execute("SELECT used_blocks FROM pragma_database_size()").fetchone()
    assert oid is not None and used is not None
    return int(oid[0]), int(used[0])


def test_a_seal_keeps_the_hot_table_and_its_checkpoint_drops_the_sealed_rows(tmp_path: Path) -> None:
    """A seal once copied the hot table's live rows (1-2 minutes of every metric) into a fresh
    table, beside the old one, to shed the sealed rows' row groups: that copy lifted a 64-node hub's
    RSS by up to ~20 MiB each minute and held the writer out meanwhile. The checkpoint after the
    DELETE drops them by itself: the hot table stays, and the file does not grow seal by seal."""
    path = tmp_path / "p.duckdb"
    with DuckDBStore(str(path), seal_interval_s=60, durable=False, raw_retention_s=1e9) as store:
        fill(store, 0, 150, n_gpus=64)
        store.rollup(150)
        table, _ = _hot_table(store)
        used = []
        for minute in range(150, 150 + 12 * 60, 60):
            fill(store, minute, minute + 60, n_gpus=64)
            store.rollup(minute + 60)
            assert _hot_table(store)[0] == table
            used.append(_hot_table(store)[1])
        assert store.stats()["chunk_files"] == 13
        assert store.stats()["rows"]["samples"] < 64 * 200  # the live rows only
        assert max(used[6:]) <= max(used[:6]) + 2, used  # rollups grow a little; the hot table not
        exact(store, 0, 150 + 12 * 60 - 1)
