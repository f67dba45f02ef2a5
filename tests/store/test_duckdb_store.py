"""Round trips through DuckDBStore: telemetry, snapshot, aggregates, events, training, alerts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.model import Alert, Batch, Event, TrainingRecord
from gpuscope.store.duckdb import DuckDBStore
from store.store_helpers import frame, gpu, ticks


def test_series_round_trip_at_full_resolution(store: DuckDBStore) -> None:
    ents = [gpu("n0", 0), gpu("n0", 1)]
    for b in ticks(0, 100, ents):
        store.append(b)
    points = store.series("util", {"node": "n0", "gpu": "1"}, 10, 19, points=300)
    assert [(p.ts, p.value) for p in points] == [(float(t), float(t + 1)) for t in range(10, 20)]


def test_series_downsamples_to_at_most_points_with_bucket_means(store: DuckDBStore) -> None:
    store.append(Batch("s", frames=[f for b in ticks(0, 1000, [gpu("n0", 0)]) for f in b.frames]))
    points = store.series("util", {"gpu": "0"}, 0, 999, points=10)
    assert len(points) == 10
    assert [p.ts for p in points] == [100.0 * k for k in range(10)]
    assert [p.value for p in points] == [100.0 * k + 49.5 for k in range(10)]
    assert len(store.series("util", {"gpu": "0"}, 0, 999, points=7)) <= 7


def test_series_over_several_entities_is_their_mean(store: DuckDBStore) -> None:
    for b in ticks(0, 10, [gpu("n0", 0), gpu("n0", 1), gpu("n1", 0)]):
        store.append(b)
    points = store.series("util", {"node": "n0"}, 0, 9)
    assert [p.value for p in points] == [t + 0.5 for t in range(10)]
    assert store.series("util", {"node": "nope"}, 0, 9) == []
    assert store.series("no_such_metric", {}, 0, 9) == []


def test_series_over_thousands_of_entities(store: DuckDBStore) -> None:
    ents = [gpu("big", i) for i in range(2_500)]  # more than fit inline in the SQL
    for t in range(3):
        store.append(
            Batch("s", frames=[frame(float(t), ["util"], ents, [[t + i % 2] for i in range(2_500)])])
        )
    assert [p.value for p in store.series("util", {"node": "big"}, 0, 2)] == [0.5, 1.5, 2.5]
    assert store.aggregate("util", "node", 0, 2) == [
        {"group": "big", "mean": 1.5, "min": 0.0, "max": 3.0, "count": 7_500}
    ]


def test_attribution_labels_are_per_row_and_keep_one_series(store: DuckDBStore) -> None:
    for t in range(20):
        job = "a" if t < 10 else "b"
        store.append(Batch("s", frames=[frame(float(t), ["util"], [gpu("n0", 0, job)], [[float(t)]])]))
    assert len(store.entities) == 1
    assert [p.value for p in store.series("util", {"gpu": "0", "job": "b"}, 0, 19)] == [
        float(t) for t in range(10, 20)
    ]
    assert len(store.series("util", {"gpu": "0"}, 0, 19)) == 20
    snap = store.snapshot()
    assert snap[0]["labels"] == {"node": "n0", "gpu": "0", "job": "b"}


def test_nan_values_are_stored_as_missing(store: DuckDBStore) -> None:
    ents = [gpu("n0", 0), gpu("n0", 1)]
    result = store.append(
        Batch("s", frames=[frame(1.0, ["util", "temp"], ents, [[50.0, math.nan], [math.nan, 70.0]])])
    )
    assert result.samples == 2
    assert store.series("temp", {"gpu": "0"}, 0, 5) == []
    assert [p.value for p in store.series("temp", {"gpu": "1"}, 0, 5)] == [70.0]
    agg = store.aggregate("util", "gpu", 0, 5)
    assert agg == [{"group": "0", "mean": 50.0, "min": 50.0, "max": 50.0, "count": 1}]
    assert store.snapshot()[1]["values"] == {"temp": 70.0}


def test_infinite_and_out_of_range_values_are_refused_and_counted(store: DuckDBStore) -> None:
    vals = [[math.inf, 1e39, 5.0]]
    result = store.append(Batch("s", frames=[frame(1.0, ["a", "b", "c"], [gpu("n0", 0)], vals)]))
    assert (result.samples, result.refused_samples) == (1, 2)
    assert result.notes and "float32" in result.notes[0]
    assert store.counters.get("store.refused_samples") == 2


def test_values_are_float32(store: DuckDBStore) -> None:
    store.append(Batch("s", frames=[frame(1.0, ["temp"], [gpu("n0", 0)], [[61.3]])]))
    (point,) = store.series("temp", {"gpu": "0"}, 0, 2)
    assert point.value == pytest.approx(61.3, rel=1e-6)
    assert point.value == float(np.float32(61.3))


def test_snapshot_latest_values_and_max_age(store: DuckDBStore) -> None:
    ents = [gpu("n0", 0), gpu("n0", 1)]
    for b in ticks(0, 50, ents):
        store.append(b)
    # gpu 1 stops reporting temp at t=50, gpu 0 keeps going
    for t in range(50, 60):
        store.append(Batch("s", frames=[frame(float(t), ["util", "temp"], ents[:1], [[1.0, 60.0 + t]])]))
    snap = {s["labels"]["gpu"]: s for s in store.snapshot()}
    assert snap["0"] == {"labels": gpu("n0", 0), "ts": 59.0, "values": {"util": 1.0, "temp": 119.0}}
    assert snap["1"] == {"labels": gpu("n0", 1), "ts": 49.0, "values": {"util": 50.0}}
    fresh = store.snapshot(["util"], max_age=5)
    assert [s["labels"]["gpu"] for s in fresh] == ["0"]
    assert store.snapshot(["unknown"]) == []


def test_snapshot_ignores_late_older_rows(store: DuckDBStore) -> None:
    store.append(Batch("s", frames=[frame(10.0, ["util"], [gpu("n0", 0)], [[10.0]])]))
    store.append(Batch("s", frames=[frame(5.0, ["util"], [gpu("n0", 0)], [[5.0]])]))
    assert store.snapshot()[0]["values"] == {"util": 10.0}


def test_aggregate_by_identity_and_attribution_labels(store: DuckDBStore) -> None:
    ents = [gpu("n0", 0, "a"), gpu("n0", 1, "a"), gpu("n1", 0, "b"), {"node": "n1"}]
    for b in ticks(0, 10, ents):
        store.append(b)
    by_node = store.aggregate("util", "node", 0, 9)
    assert by_node == [
        {"group": "n0", "mean": 5.0, "min": 0.0, "max": 10.0, "count": 20},
        {"group": "n1", "mean": 7.0, "min": 2.0, "max": 12.0, "count": 20},
    ]
    by_job = store.aggregate("util", "job", 0, 9)
    assert [(g["group"], g["count"]) for g in by_job] == [("a", 20), ("b", 10)]
    assert store.aggregate("util", "rack", 0, 9) == []


def test_cardinality_limit_refuses_new_label_sets_but_keeps_known_ones(tmp_path) -> None:
    store = DuckDBStore(str(tmp_path / "s.duckdb"), max_entities=2)
    try:
        store.append(Batch("s", frames=[frame(1.0, ["util"], [gpu("n0", 0), gpu("n0", 1)], [[1.0], [2.0]])]))
        ents = [gpu("n0", 0), gpu("n0", 2), gpu("n0", 1), gpu("n0", 3)]
        result = store.append(Batch("s", frames=[frame(2.0, ["util"], ents, [[3.0], [4.0], [5.0], [6.0]])]))
        assert (result.samples, result.refused_entities, result.refused_samples) == (2, 2, 2)
        assert "entity limit" in result.notes[0]
        assert [p.value for p in store.series("util", {"gpu": "1"}, 0, 5)] == [2.0, 5.0]
        assert store.counters.get("store.refused_entities") == 2
        assert len(store.entities) == 2
    finally:
        store.close()


def test_metric_column_limit_refuses_new_metrics(tmp_path) -> None:
    store = DuckDBStore(str(tmp_path / "s.duckdb"), max_metrics=2)
    try:
        result = store.append(
            Batch("s", frames=[frame(1.0, ["a", "b", "c"], [gpu("n0", 0)], [[1.0, 2.0, 3.0]])])
        )
        assert (result.samples, result.refused_samples) == (2, 1)
        assert "metric column limit" in result.notes[0]
        assert store.series("c", {}, 0, 2) == []
        assert [p.value for p in store.series("b", {}, 0, 2)] == [2.0]
    finally:
        store.close()


def test_metric_names_are_case_sensitive(store: DuckDBStore) -> None:
    store.append(Batch("s", frames=[frame(1.0, ["Temp", "temp"], [gpu("n0", 0)], [[1.0, 2.0]])]))
    assert [p.value for p in store.series("Temp", {}, 0, 2)] == [1.0]
    assert [p.value for p in store.series("temp", {}, 0, 2)] == [2.0]


def test_duplicate_batch_id_is_stored_once(store: DuckDBStore) -> None:
    batch = Batch("s", frames=[frame(1.0, ["util"], [gpu("n0", 0)], [[1.0]])], batch_id="node-0:1")
    first = store.append(batch)
    again = store.append(batch)
    assert (first.duplicate, first.samples) == (False, 1)
    assert (again.duplicate, again.samples) == (True, 0)
    assert store.stats()["raw_rows"] == 1
    assert store.counters.get("store.duplicate_batches") == 1


def test_duplicate_batch_id_is_remembered_after_reopen(tmp_path) -> None:
    path = str(tmp_path / "s.duckdb")
    batch = Batch("s", frames=[frame(1.0, ["util"], [gpu("n0", 0)], [[1.0]])], batch_id="x")
    with DuckDBStore(path) as store:
        store.append(batch)
    with DuckDBStore(path) as store:
        assert store.append(batch).duplicate
        assert store.stats()["raw_rows"] == 1


def test_bad_frames_raise_clear_errors(store: DuckDBStore) -> None:
    with pytest.raises(ValueError, match=r"frames\[0\]\.values: shape"):
        store.append(Batch("s", frames=[frame(1.0, ["a", "b"], [gpu("n0", 0)], [[1.0]])]))
    with pytest.raises(ValueError, match=r"frames\[0\]\.ts"):
        store.append(Batch("s", frames=[frame(-1.0, ["a"], [gpu("n0", 0)], [[1.0]])]))
    with pytest.raises(ValueError, match="names a metric twice"):
        store.append(Batch("s", frames=[frame(1.0, ["a", "a"], [gpu("n0", 0)], [[1.0, 2.0]])]))
    with pytest.raises(ValueError, match="start"):
        store.series("a", {}, 5, 1)


def test_events_filtered_by_kind_and_labels(store: DuckDBStore) -> None:
    events = [
        Event(1.0, "xid", {"node": "n0", "gpu": "3"}, {"code": 79}),
        Event(2.0, "heartbeat", {"job": "llm", "rank": "0"}),
        Event(3.0, "xid", {"node": "n1", "gpu": "0"}, {"code": 13}),
    ]
    assert store.append(Batch("s", events=events)).events == 3
    assert store.events(0, 10) == events
    assert store.events(0, 10, kind="xid", labels={"node": "n1"}) == [events[2]]
    assert store.events(1.5, 2.5) == [events[1]]
    assert store.events(0, 10, limit=2) == events[1:]
    with pytest.raises(ValueError, match="label"):
        store.events(0, 10, labels={"bad key'": "x"})


def test_training_records_keep_nan_and_missing_apart(store: DuckDBStore) -> None:
    records = [
        TrainingRecord(1.0, "llm", 0, 10, {"loss": 2.5, "grad_norm": 1.0}, {"node": "n0"}),
        TrainingRecord(1.0, "llm", 1, 10, {"loss": math.nan}),
        TrainingRecord(2.0, "llm", 0, 11, {"loss": math.inf}),
        TrainingRecord(2.0, "other", 0, 11, {"loss": 1.0}),
    ]
    assert store.append(Batch("s", training=records)).training == 4
    got = store.training("llm", 0, 10)
    assert [(r.rank, r.step, r.labels) for r in got] == [(0, 10, {"node": "n0"}), (1, 10, {}), (0, 11, {})]
    assert got[0].metrics == {"loss": 2.5, "grad_norm": 1.0}
    assert list(got[1].metrics) == ["loss"] and math.isnan(got[1].metrics["loss"])
    assert got[2].metrics == {"loss": math.inf}
    assert [r.step for r in store.training("llm", 0, 10, rank=0)] == [10, 11]
    assert [r.step for r in store.training("llm", 0, 10, limit=1)] == [11]


def _alert(aid: str, started: float, resolved: float | None = None) -> Alert:
    return Alert(
        aid,
        "gpu_xid_fatal",
        "P1",
        "platform",
        {"node": "n0", "gpu": "3"},
        started,
        "XID 79",
        2.5,
        resolved_at=resolved,
        last_seen=started,
        details={"xid": 79},
    )


def test_alerts_upsert_and_newest_first(store: DuckDBStore) -> None:
    store.save_alert(_alert("a1", 10.0))
    store.save_alert(_alert("a2", 20.0))
    store.save_alert(_alert("a1", 10.0, resolved=15.0))
    alerts = store.alerts()
    assert [a.id for a in alerts] == ["a2", "a1"]
    assert alerts[1].resolved_at == 15.0 and alerts[1].details == {"xid": 79}
    assert [a.id for a in store.alerts(firing_only=True)] == ["a2"]
    assert alerts[0] == _alert("a2", 20.0)


def test_data_survives_reopen(tmp_path) -> None:
    path = str(tmp_path / "s.duckdb")
    with DuckDBStore(path) as store:
        for b in ticks(0, 30, [gpu("n0", 0)]):
            store.append(b)
        store.append(Batch("s", events=[Event(1.0, "xid", {"node": "n0"}, {"code": 79})]))
    with DuckDBStore(path) as store:
        assert len(store.series("util", {"gpu": "0"}, 0, 29)) == 30
        assert store.snapshot()[0]["values"] == {"util": 29.0}
        assert store.events(0, 5)[0].data == {"code": 79}
        store.append(
            Batch("s", frames=[frame(30.0, ["util", "new"], [gpu("n0", 0), gpu("n0", 1)], [[1, 2], [3, 4]])])
        )
        assert len(store.entities) == 2


def test_stats_report_rows_and_bytes(file_store: DuckDBStore) -> None:
    for b in ticks(0, 10, [gpu("n0", 0)]):
        file_store.append(b)
    file_store.stats()
    file_store.append(
        Batch("s", frames=[frame(11.0, ["new_metric"], [gpu("n0", 0)], [[1.0]])])
    )  # ALTER TABLE
    file_store.checkpoint()
    stats = file_store.stats()
    assert stats["raw_rows"] == 11 and stats["entities"] == 1 and stats["metrics"] == 2
    assert stats["wal_bytes"] == 0
    assert stats["file_bytes"] > 0 and stats["used_bytes"] > 0


def test_closed_store_refuses_work(tmp_path) -> None:
    store = DuckDBStore(str(tmp_path / "s.duckdb"))
    store.close()
    store.close()
    with pytest.raises(Exception, match="closed"):
        store.append(Batch("s"))


def test_alerts_saved_together_are_one_write_and_a_repeated_alert_is_saved_as_listed_last() -> None:
    store = DuckDBStore(":memory:", durable=False)
    try:
        alerts = [
            Alert(f"al-{i}", "gpu_lost", "P1", "infra", {"node": f"n{i}", "gpu": "0"}, 10.0 + i, "lost", 1.0)
            for i in range(300)
        ]
        store.save_alerts(alerts[:200])
        again = Alert("al-7", "gpu_lost", "P1", "infra", {"node": "n7", "gpu": "0"}, 17.0, "lost", 1.0)
        again.resolved_at = 30.0
        store.save_alerts([*alerts[150:], again])  # al-7 updated, 150..199 written again
        store.save_alerts([])
        assert store.counters.get("store.alert_writes") == 2
        back = {a.id: a for a in store.alerts(limit=1000)}
        assert len(back) == 300 and back["al-7"].resolved_at == 30.0
        assert [a.id for a in store.alerts(firing_only=True, limit=1000)] == [
            f"al-{i}" for i in range(299, -1, -1) if i != 7
        ]
        store.save_alert(alerts[0])
        assert store.counters.get("store.alert_writes") == 3
    finally:
        store.close()
