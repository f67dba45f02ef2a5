"""The GPU table scatters each frame's GPU rows into one matrix: layouts may differ per frame."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.detect import frames
from gpuscope.detect.engine import DetectionEngine
from gpuscope.detect.gputable import GpuTable
from gpuscope.model import Batch, Frame


def _frame(ts: float, metrics: list[str], rows: list[dict[str, str]], values: list[list[float]]) -> Frame:
    return Frame(ts, metrics, rows, np.array(values, float))


def test_frames_of_different_layouts_update_only_the_metrics_they_carry() -> None:
    table = GpuTable(("gpu_temp_celsius", "gpu_utilization_percent"))
    gpus = [{"node": "n1", "gpu": "0", "job": "a"}, {"node": "n1", "gpu": "1"}]
    node_row = {"node": "n1"}
    first = _frame(
        10.0,
        ["gpu_utilization_percent", "node_load", "gpu_temp_celsius"],
        [node_row, *gpus],
        [[math.nan, 3.0, math.nan], [90.0, math.nan, 70.0], [10.0, math.nan, 50.0]],
    )
    ids = table.ingest(frames.index(first))
    assert ids is not None and ids.tolist() == [0, 1]
    assert table.column("gpu_utilization_percent").tolist() == [90.0, 10.0]
    assert table.column("gpu_temp_celsius").tolist() == [70.0, 50.0]
    # another layout (temperature only, other column order) and a new GPU: utilisation keeps its
    # last value, the new GPU's unreported metric stays NaN
    second = _frame(
        11.0,
        ["gpu_power_watts", "gpu_temp_celsius"],
        [{"node": "n2", "gpu": "0"}, gpus[0]],
        [[300.0, 40.0], [250.0, 72.0]],
    )
    assert table.ingest(frames.index(second)) is not None
    assert table.column("gpu_temp_celsius").tolist() == [72.0, 50.0, 40.0]
    util = table.column("gpu_utilization_percent")
    assert util[:2].tolist() == [90.0, 10.0] and math.isnan(util[2])
    assert table.ts[: table.n].tolist() == [11.0, 10.0, 11.0]
    assert [table.job_names[c] if c >= 0 else None for c in table.job[: table.n]] == ["a", None, None]
    # the first layout again, after the table grew past its first allocation
    many = [{"node": f"m{i}", "gpu": "0"} for i in range(40)]
    third = _frame(12.0, ["gpu_utilization_percent"], many, [[float(i)] for i in range(40)])
    assert table.ingest(frames.index(third)) is not None
    assert table.column("gpu_utilization_percent")[3:].tolist() == [float(i) for i in range(40)]
    assert table.column("gpu_temp_celsius")[:3].tolist() == [72.0, 50.0, 40.0]


def test_a_frame_without_the_tables_metrics_still_stamps_its_gpus() -> None:
    table = GpuTable(("gpu_temp_celsius",))
    frame = _frame(5.0, ["gpu_power_watts"], [{"node": "n1", "gpu": "0"}], [[100.0]])
    assert table.ingest(frames.index(frame)) is not None
    assert table.ts[: table.n].tolist() == [5.0]
    assert math.isnan(table.column("gpu_temp_celsius")[0])


def test_a_tick_of_frames_at_once_leaves_the_table_as_frame_by_frame_would() -> None:
    """Two ticks of the same nodes and a frame of another layout between them, in one call."""
    metrics = ("gpu_temp_celsius", "gpu_utilization_percent")
    layout = ["gpu_utilization_percent", "gpu_temp_celsius"]

    def node(ts: float, name: str, job: str | None, value: float) -> Frame:
        rows = [{"node": name, "gpu": str(g), **({"job": job} if job else {})} for g in range(2)]
        return _frame(ts, layout, [{"node": name}, *rows], [[1.0, 1.0], [value, 40.0], [value + 1, 41.0]])

    tick = [
        node(10.0, "n1", "a", 50.0),
        node(10.0, "n2", None, 60.0),
        _frame(10.5, ["gpu_temp_celsius"], [{"node": "n1", "gpu": "1"}], [[99.0]]),
        node(11.0, "n1", "b", 70.0),
        node(11.0, "n3", "c", 80.0),
        node(12.0, "n1", None, 90.0),  # the last of three reports of n1 wins
    ]
    one_by_one, at_once = GpuTable(metrics), GpuTable(metrics)
    for frame in tick:
        one_by_one.ingest(frames.index(frame))
    at_once.ingest_many(frames.TickRows.of([frames.index(frame) for frame in tick]))
    assert at_once.keys == one_by_one.keys
    for m in metrics:
        assert at_once.column(m).tolist() == one_by_one.column(m).tolist()
    assert (
        at_once.ts[: at_once.n].tolist()
        == one_by_one.ts[: one_by_one.n].tolist()
        == [12.0] * 2 + [10.0] * 2 + [11.0] * 2
    )
    assert at_once.job[: at_once.n].tolist() == one_by_one.job[: one_by_one.n].tolist()
    assert at_once.column("gpu_utilization_percent")[:2].tolist() == [90.0, 91.0]


def test_a_row_older_than_its_gpus_newest_is_stale_counted_and_not_written() -> None:
    """In a cluster a part forwarded by a peer hub can arrive after a newer one sent straight:
    the table keeps each GPU's newest report, by the frame's time, one by one and a tick at once."""
    metrics = ("gpu_temp_celsius",)

    def report(ts: float, temps: dict[str, float]) -> Frame:
        rows = [{"node": "n1", "gpu": g} for g in temps]
        return _frame(ts, ["gpu_temp_celsius"], rows, [[t] for t in temps.values()])

    newer, late = report(20.0, {"0": 80.0, "1": 81.0}), report(10.0, {"0": 30.0, "2": 32.0})
    for at_once in (False, True):
        table = GpuTable(metrics)
        if at_once:
            table.ingest_many(frames.TickRows.of([frames.index(newer), frames.index(late)]))
        else:
            table.ingest(frames.index(newer))
            table.ingest(frames.index(late))
        # GPU 0's late row is stale; GPU 2 is new, so its row is its newest
        assert table.column("gpu_temp_celsius").tolist() == [80.0, 81.0, 32.0], at_once
        assert table.ts[: table.n].tolist() == [20.0, 20.0, 10.0]
        assert table.counters.get("detect_stale_gpu_rows") == 1
        table.ingest(frames.index(report(20.0, {"1": 85.0})))  # as new as the newest: not stale
        assert table.column("gpu_temp_celsius")[1] == 85.0
        assert table.counters.get("detect_stale_gpu_rows") == 1


def test_the_engine_counts_stale_rows_for_every_table_detector() -> None:
    engine = DetectionEngine()
    table = engine.feeds.table
    metric = table.metrics[0]
    for ts, value in ((20.0, 80.0), (10.0, 30.0)):
        frame = _frame(ts, [metric], [{"node": "n1", "gpu": "0"}], [[value]])
        engine.observe(Batch("peer", frames=[frame]))
    assert engine.stats()["detect_stale_gpu_rows"] == 1
    assert table.ts[: table.n].tolist() == [20.0] and table.column(metric)[0] == 80.0


def test_the_table_numbers_nodes_once_in_the_order_their_gpus_are_first_seen() -> None:
    table = GpuTable(("gpu_temp_celsius",))
    first = _frame(
        1.0,
        ["gpu_temp_celsius"],
        [{"node": "b", "gpu": "0"}, {"node": "a", "gpu": "0"}, {"node": "b", "gpu": "1"}],
        [[50.0], [51.0], [52.0]],
    )
    assert table.ingest(frames.index(first)) is not None
    # past the first allocation: the codes of the GPUs seen before are kept
    many = [{"node": f"m{i // 8}", "gpu": str(i % 8)} for i in range(40)]
    second = _frame(2.0, ["gpu_temp_celsius"], [*many, {"node": "a", "gpu": "1"}], [[40.0]] * 41)
    assert table.ingest(frames.index(second)) is not None
    names = list(table.node_codes)
    assert names == ["b", "a", "m0", "m1", "m2", "m3", "m4"]
    assert [names[c] for c in table.node[: table.n]] == [node for node, _ in table.keys]


def test_a_metric_given_twice_is_read_from_its_first_column_as_every_stage_reads_it() -> None:
    table = GpuTable(("gpu_temp_celsius",))
    frame = _frame(
        1.0, ["gpu_temp_celsius", "gpu_temp_celsius"], [{"node": "n1", "gpu": "0"}], [[50.0, 99.0]]
    )
    view = frames.index(frame)
    assert table.ingest(view) is not None
    assert table.column("gpu_temp_celsius").tolist() == [view.gpu_column("gpu_temp_celsius")[0]] == [50.0]
