"""Each minute's fold of GPU time reads its window, not every hour cell the store keeps."""

from __future__ import annotations

import math
import re
from pathlib import Path

import duckdb

from gpuscope.store.base import GpuTime
from gpuscope.store.duckdb import DuckDBStore, gpu_time

DAY = 86_400.0
NOW = 100 * DAY


def _history(days: int) -> list[GpuTime]:
    """What a long-running store wrote, oldest first: each hour its hour cells and the minute cells
    saved meanwhile (folded and deleted since), interleaved as the appends were."""
    start = NOW - days * DAY
    cells: list[GpuTime] = []
    for h in range(days * 24):
        hour = start + h * 3600.0
        cells += [
            GpuTime(60, hour + m * 60.0, "node-0", "0", "job", "team", "", "training", 60.0, 0.0)
            for m in range(60)
        ]
        cells += [
            GpuTime(3600, hour, f"node-{n}", "", "job", "team", "", "training", 3600.0, 0.0)
            for n in range(200)
        ]
    return cells


def _minutes(start: float, minutes: int) -> list[GpuTime]:
    return [
        GpuTime(60, start + m * 60.0, f"node-{n}", "0", "job", "team", "", "training", 60.0, 0.0)
        for m in range(minutes)
        for n in range(4)
    ]


def _scanned(con: duckdb.DuckDBPyConnection, tmp_path: Path, before: float, since: float) -> int:
    out = tmp_path / "profile.json"
    con.execute("PRAGMA enable_profiling='json'")
    con.execute(f"SET profiling_output='{out}'")
    window = [before - 60.0, since]
    con.execute(f"SELECT count(*) FROM gpu_time WHERE {gpu_time.FOLD_WINDOW}", window).fetchall()
    con.execute("PRAGMA disable_profiling")
    # the scans' own figures (DuckDB's JSON profile nests operators under "children")
    return sum(int(n) for n in re.findall(r'"rows_scanned": *([0-9]+)', out.read_text()))


def test_a_fold_with_its_window_skips_the_old_hour_cells(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "g.duckdb"))
    con.execute(gpu_time.DDL)
    gpu_time.save(con, _history(120))  # 576,000 hour cells: four months of 200 nodes
    con.execute("DELETE FROM gpu_time WHERE res = 60")  # folded long ago
    gpu_time.save(con, _minutes(NOW - 3 * 3600.0, 180))
    before = NOW - 2 * 3600.0
    everything = _scanned(con, tmp_path, before, -math.inf)
    assert everything >= 576_000  # without a lower bound the zone maps skip nothing
    scanned = _scanned(con, tmp_path, before, before - 3600.0 - 60.0)
    assert 2 * scanned < everything, scanned  # the last row groups only (122,880 rows each)
    assert gpu_time.fold(con, before, before - 3600.0 - 60.0) == 4 * 60
    left = con.execute("SELECT count(*) FROM gpu_time WHERE res = 60").fetchall()[0][0]
    assert left == 4 * 120


def test_the_store_folds_every_minute_cell_across_folds_and_late_saves(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    try:
        store.save_gpu_time(_minutes(NOW - 10 * 3600.0, 600))
        assert store.fold_gpu_time(NOW - 5 * 3600.0) == 4 * 300  # the first fold reads everything
        late = _minutes(NOW - 5 * 3600.0 - 1800.0, 1)  # saved late, half an hour before the bound
        store.save_gpu_time(late)
        assert store.fold_gpu_time(NOW - 4 * 3600.0) == 4 * 60 + 4
        cells = store.gpu_time(0.0, NOW)
        assert sum(c.seconds for c in cells) == 60.0 * 4 * 601
        assert {c.res for c in cells if c.bucket < NOW - 4 * 3600.0 - 60.0} == {3600}
    finally:
        store.close()
