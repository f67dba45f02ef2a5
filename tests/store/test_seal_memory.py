"""A seal writes a bounded number of rows at a time: DuckDB's Parquet writer holds a whole row
group, with the sort in front of it, so a seal that wrote a 64-node minute (~35,000 rows) at once
lifted DuckDB's allocator by ~24 MiB every minute (issue 13 (d): the upkeep's swing decided the
soak's figure). The seal now writes ranges of entities of about ``SEAL_SORT_ROWS`` rows, and the
merge of a closed hour writes its pieces again into large row groups: what is read back is the
same, before and after the merge and across a restart."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import numpy as np
import pytest

from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.duckdb.allocator import ALLOCATOR
from gpuscope.store.duckdb.chunks import JOIN_ROWS
from store.store_helpers import frame, gpu

MIB = 2**20
HOUR = 3600


class AllocatorPeak:
    """The most DuckDB's jemalloc held allocated while the block ran, read every millisecond (a
    reading can only miss a peak, never invent one)."""

    def __init__(self) -> None:
        self.base = 0
        self.peak = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, ALLOCATOR.read().get("allocated", 0))
            self._halt.wait(0.001)

    def __enter__(self) -> AllocatorPeak:
        self.base = self.peak = ALLOCATOR.read()["allocated"]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join()

    @property
    def lift_mib(self) -> float:
        return (self.peak - self.base) / MIB


def noisy_minutes(store: DuckDBStore, start: int, stop: int, gpus: int, metrics: int) -> None:
    """Every GPU reports every metric each second, random values (little to compress)."""
    rng = np.random.default_rng(start)
    ents = [gpu(f"n{i // 8}", i % 8) for i in range(gpus)]
    names = [f"m{k}" for k in range(metrics)]
    for t0 in range(start, stop, 60):
        values = rng.random((60, gpus, metrics)).tolist()
        store.append(Batch("test", frames=[frame(float(t0 + k), names, ents, values[k]) for k in range(60)]))


@pytest.mark.skipif(
    not ALLOCATOR.available, reason="this DuckDB build does not export its jemalloc's mallctl"
)
def test_sealing_a_64_node_minute_lifts_duckdbs_allocator_by_a_bounded_amount(tmp_path: Path) -> None:
    # 576 entities x 48 metrics: a minute of a 64-node hub (8 GPUs and a node each), ~35,000 rows
    with DuckDBStore(str(tmp_path / "m.duckdb"), durable=False, raw_retention_s=1e9) as store:
        noisy_minutes(store, 0, 60, gpus=576, metrics=48)
        store.rollup(70)  # a hub's upkeep a minute earlier: [0, 60) rolled up, nothing sealed yet
        noisy_minutes(store, 60, 120, gpus=576, metrics=48)
        store.stats()  # the rows reach the hot table before the measurement
        with AllocatorPeak() as peak:
            sealed = store.rollup(130)["sealed_rows"]  # seals [0, 60), checkpoints, rolls [60, 120) up
        assert sealed == 60 * 576
        # writing the whole minute at once lifted it by ~25 MiB; in ranges of 8,192 rows the
        # upkeep's largest step is the checkpoint after the seal (the hot minute compressed into
        # the file), ~10 MiB
        assert peak.lift_mib < 16, peak.lift_mib
        assert store.aggregate("m7", "node", 0, 119)[0]["count"] == 120 * 8


def row_groups(path: Path) -> list[int]:
    con = duckdb.connect()
    rows = con.execute(
        "SELECT row_group_num_rows FROM parquet_metadata(?) WHERE path_in_schema = 'ts' "
        "ORDER BY row_group_id",
        [str(path)],
    ).fetchall()
    con.close()
    return [int(n) for (n,) in rows]


def test_rows_sealed_in_ranges_read_back_the_same_merged_and_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    gpus = 60  # a 10-minute piece of 36,000 rows: sealed in ranges, one row group after the merge
    ents = [gpu(f"n{i // 8}", i % 8) for i in range(gpus)]

    def value(t: int, i: int) -> float:
        return float(t * 100 + i)

    def read(store: DuckDBStore) -> tuple[list[list[tuple[float, float]]], list[dict[str, object]]]:
        series = [
            [
                (p.ts, p.value)
                for p in store.series("util", {"node": f"n{i // 8}", "gpu": str(i % 8)}, 0, 4199, 4200)
            ]
            for i in (0, 17, 59)
        ]
        return series, sorted(store.aggregate("util", "node", 0, 4199), key=lambda r: str(r["group"]))

    with DuckDBStore(str(path), seal_interval_s=600, durable=False) as store:
        for t0 in range(0, 4200, 60):
            frames = [
                frame(float(t), ["util"], ents, [[value(t, i)] for i in range(gpus)])
                for t in range(t0, t0 + 60)
            ]
            store.append(Batch("test", frames=frames))
            store.rollup(t0 + 60)
            store.compact(t0 + 60)
            if t0 == 3000:
                before = read(store)  # five pieces sealed, the rest hot
                (piece, *_) = store.chunks.all()
                assert len(row_groups(Path(f"{path}.chunks") / piece.file)) > 1  # written in ranges
        merged = next(c for c in store.chunks.all() if c.merged)
        assert merged.rows == gpus * HOUR
        after = read(store)
    expected = [[(float(t), value(t, i)) for t in range(4200)] for i in (0, 17, 59)]
    assert before[0] == [s[:3060] for s in expected]
    assert after[0] == expected
    assert [r["count"] for r in after[1]] == [8 * 4200] * 7 + [4 * 4200]
    # the hour's pieces were written again as one row group each: as large as a whole seal made them
    assert row_groups(Path(f"{path}.chunks") / merged.file) == [gpus * 600] * 6
    assert gpus * 600 >= JOIN_ROWS
    with DuckDBStore(str(path)) as again:
        assert read(again) == after
