"""The same user-visible behaviour on every storage backend: the embedded DuckDB store, and the
remote backend against a real VictoriaMetrics and a real Prometheus (through the hub's HTTP API).

Timestamps are recent (Prometheus refuses samples far older than its newest ones)."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import orjson
import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.store.base import GpuTime
from gpuscope.web.api import HubApi
from store_remote.tsdbs import StoreFactory

pytestmark = pytest.mark.integration

T0 = float(int(time.time()) - 300)  # whole seconds: bucket edges fall where the tests expect


def client_for(store: Any) -> tuple[TestClient, Hub]:
    hub = Hub(store)
    return TestClient(HubApi(hub, clock=lambda: T0 + 300).app), hub


def batch(k: int = 0, node: str = "node-0", gpus: int = 2) -> dict[str, Any]:
    return {
        "source": node,
        "batch_id": f"{node}-{k}",
        "frames": [
            {
                "ts": T0 + k,
                "metrics": ["gpu_utilization_percent", "gpu_temp_celsius"],
                "entities": [{"node": node, "gpu": str(g), "job": "train"} for g in range(gpus)],
                "values": [[90.0 + g, 60.0 + k] for g in range(gpus)],
            }
        ],
        "events": [{"ts": T0 + k, "kind": "xid", "labels": {"node": node, "gpu": "1"}, "data": {"code": 13}}],
        "training": [
            {
                "ts": T0 + k,
                "job": "train",
                "rank": 0,
                "step": k,
                "metrics": {"loss": 2.0 - k / 10},
                "labels": {"node": node, "gpu": "0"},
            }
        ],
    }


def post(client: TestClient, body: Any) -> Any:
    return client.post(
        "/api/v1/ingest", content=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )


def test_ingest_then_query(make_store: StoreFactory) -> None:
    client, _ = client_for(make_store())
    for k in range(5):
        r = post(client, batch(k))
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == {"samples": 4, "events": 1, "training": 1}
    span = {"start": T0 - 10, "end": T0 + 10}
    series = client.get(
        "/api/v1/series",
        params={"metric": "gpu_temp_celsius", "node": "node-0", "gpu": "1", **span, "points": 100},
    ).json()
    assert [p[1] for p in series["points"]] == [60.0, 61.0, 62.0, 63.0, 64.0]
    by_job = client.get(
        "/api/v1/series", params={"metric": "gpu_temp_celsius", "job": "train", **span, "points": 1}
    ).json()
    assert [p[1] for p in by_job["points"]] == [62.0]  # one bucket: the mean of every sample
    snap = client.get("/api/v1/snapshot", params={"metrics": "gpu_temp_celsius"}).json()["entities"]
    assert {r["labels"]["gpu"]: r["values"]["gpu_temp_celsius"] for r in snap} == {"0": 64.0, "1": 64.0}
    assert all(r["labels"] == {"node": "node-0", "gpu": r["labels"]["gpu"], "job": "train"} for r in snap)
    assert {r["ts"] for r in snap} == {T0 + 4}
    agg = client.get(
        "/api/v1/aggregate",
        params={"metric": "gpu_utilization_percent", "by": "node", "start": T0 - 100, "end": T0 + 100},
    ).json()["groups"]
    assert agg == [{"group": "node-0", "mean": 90.5, "min": 90.0, "max": 91.0, "count": 10}]
    window = {"start": T0 - 100, "end": T0 + 100}
    events = client.get("/api/v1/events", params={"kind": "xid", **window}).json()["events"]
    assert len(events) == 5 and events[0]["data"] == {"code": 13}
    training = client.get("/api/v1/training", params={"job": "train", **window}).json()
    assert [r["step"] for r in training["records"]] == [0, 1, 2, 3, 4]
    health = client.get("/api/v1/health").json()
    assert health["status"] == "ok" and health["counters"]["ingest_samples"] == 20


def test_retried_batch_is_stored_once(make_store: StoreFactory) -> None:
    client, _ = client_for(make_store())
    assert post(client, batch(1)).json()["duplicate"] is False
    assert post(client, batch(1)).json()["duplicate"] is True
    window = {"start": T0 - 100, "end": T0 + 100}
    assert len(client.get("/api/v1/events", params={"kind": "xid", **window}).json()["events"]) == 1
    agg = client.get(
        "/api/v1/aggregate", params={"metric": "gpu_temp_celsius", "by": "gpu", **window}
    ).json()["groups"]
    assert [g["count"] for g in agg] == [1, 1]


def test_bad_input_loses_nothing_accepted(make_store: StoreFactory) -> None:
    client, _ = client_for(make_store())
    post(client, batch(0))
    assert post(client, {"source": "x", "frames": "nope"}).status_code == 400
    post(client, batch(1))
    assert client.get("/api/v1/health").json()["counters"]["ingest_rejected_batches"] == 1
    series = client.get(
        "/api/v1/series",
        params={"metric": "gpu_temp_celsius", "gpu": "0", "start": T0 - 10, "end": T0 + 10, "points": 100},
    ).json()
    assert [p[1] for p in series["points"]] == [60.0, 61.0]


def test_cardinality_limit_refuses_new_entities_keeps_known(make_store: StoreFactory) -> None:
    client, hub = client_for(make_store(max_entities=2))
    assert post(client, batch(0, gpus=2)).status_code == 200
    r = post(client, batch(1, gpus=4)).json()
    assert r["refused"]["entities"] == 2 and r["refused"]["samples"] == 4
    assert r["accepted"]["samples"] == 4
    assert hub.counters.get("ingest_refused_samples") == 4


def test_alerts_and_incidents_after_evaluation(make_store: StoreFactory) -> None:
    client, hub = client_for(make_store())
    body = batch(0)
    body["events"] = [
        {
            "ts": T0,
            "kind": "xid",
            "labels": {"node": "node-0", "gpu": "1"},
            "data": {"code": 79, "message": "GPU has fallen off the bus"},
        }
    ]
    post(client, body)
    assert client.get("/api/v1/alerts").json()["alerts"] == []
    hub.evaluate(T0 + 1)
    alerts = client.get("/api/v1/alerts").json()["alerts"]
    assert [(a["rule"], a["severity"], a["entity"]) for a in alerts] == [
        ("gpu_xid_fatal", "P1", {"node": "node-0", "gpu": "1"})
    ]
    incidents = client.get("/api/v1/incidents").json()["incidents"]
    assert len(incidents) == 1 and incidents[0]["root"] == alerts[0]["id"]


def test_downsampling_means_per_bucket(make_store: StoreFactory) -> None:
    store = make_store()
    entities = [{"node": "n", "gpu": "0"}, {"node": "n", "gpu": "1"}]
    # one sample a second for two minutes, value = t (gpu 0) and t + 100 (gpu 1)
    frames = [
        Frame(T0 + t, ["gpu_power_watts"], entities, np.array([[float(t)], [t + 100.0]])) for t in range(120)
    ]
    store.append(Batch("s", frames=frames))
    pts = store.series("gpu_power_watts", {"gpu": "0"}, T0, T0 + 119, points=4)
    assert [p.value for p in pts] == [14.5, 44.5, 74.5, 104.5]  # 30 samples per bucket
    # the time of a bucket: its first sample (embedded) or its start (PromQL), within a second
    assert [p.ts - T0 for p in pts] == pytest.approx([0, 30, 60, 90], abs=1)
    both = store.series("gpu_power_watts", {"node": "n"}, T0, T0 + 119, points=1)
    assert [p.value for p in both] == [109.5]
    assert store.series("gpu_power_watts", {"gpu": "9"}, T0, T0 + 119) == []
    assert store.series("no_such_metric", {}, T0, T0 + 119) == []
    agg = store.aggregate("gpu_power_watts", "gpu", T0 + 60, T0 + 69)
    assert [(g["group"], g["count"], g["min"], g["max"]) for g in agg] == [
        ("0", 10, 60.0, 69.0),
        ("1", 10, 160.0, 169.0),
    ]


def test_snapshot_newest_per_entity_and_max_age(make_store: StoreFactory) -> None:
    store = make_store()
    # max_age counts back from now on a remote TSDB: take the times now, not at import
    t0 = float(int(time.time()) - 300)
    gpu = {"node": "n", "gpu": "0"}
    first = Frame(t0, ["m_a", "m_b"], [{**gpu, "job": "a"}], np.array([[1.0, 2.0]]))
    store.append(Batch("s", frames=[first]))
    store.append(Batch("s", frames=[Frame(t0 + 290, ["m_a"], [{**gpu, "job": "b"}], np.array([[3.0]]))]))
    rows = store.snapshot(["m_a", "m_b"])
    assert len(rows) == 1  # one GPU, whatever jobs it ran
    assert rows[0]["labels"] == {**gpu, "job": "b"} and rows[0]["values"] == {"m_a": 3.0, "m_b": 2.0}
    assert rows[0]["ts"] == t0 + 290
    recent = store.snapshot(["m_a", "m_b"], max_age=60)
    assert [r["values"] for r in recent] == [{"m_a": 3.0}]


HOSTILE = ['a"b', "back\\slash", "new\nline", '"} or vector(1) #', "x\\", "ümlaut ✓", "tab\there", "plain"]


def test_hostile_label_values_round_trip_and_select_only_themselves(make_store: StoreFactory) -> None:
    store = make_store()
    entities = [{"node": h, "gpu": "0"} for h in HOSTILE]
    values = np.arange(len(HOSTILE), dtype=np.float64).reshape(-1, 1)
    store.append(Batch("s", frames=[Frame(T0, ["gpu_temp_celsius"], entities, values)]))
    for i, hostile in enumerate(HOSTILE):
        pts = store.series("gpu_temp_celsius", {"node": hostile}, T0 - 1, T0 + 1)
        assert [p.value for p in pts] == [float(i)], hostile
    snap = store.snapshot(["gpu_temp_celsius"])
    nodes = {r["labels"]["node"]: r["values"]["gpu_temp_celsius"] for r in snap}
    assert nodes == {h: float(i) for i, h in enumerate(HOSTILE)}
    groups = {g["group"] for g in store.aggregate("gpu_temp_celsius", "node", T0 - 1, T0 + 1)}
    assert groups == set(HOSTILE)
    # a hostile label *name* selects nothing rather than reaching the query
    assert store.series("gpu_temp_celsius", {"__name__": "x"}, T0 - 1, T0 + 1) == []


def test_values_round_trip_as_float32(make_store: StoreFactory) -> None:
    store = make_store()
    values = [0.1, 1e-7, 123456.789, 3.4e38, -2.5, 0.0]
    metrics = [f"v_{i}" for i in range(len(values))]
    store.append(Batch("s", frames=[Frame(T0, metrics, [{"node": "n"}], np.array([values]))]))
    row = store.snapshot(metrics)[0]["values"]
    for m, v in zip(metrics, values, strict=True):
        # stored as float32; VictoriaMetrics answers JSON with 12 significant digits
        assert math.isclose(row[m], float(np.float32(v)), rel_tol=1e-11)
        assert math.isclose(row[m], v, rel_tol=1e-7)


def minute_cell(bucket: float, seconds: float, gpu: str = "0", lost: float = 0.0) -> GpuTime:
    return GpuTime(60, bucket, "node-0", gpu, "train", "team-a", "", "training", seconds, lost)


def test_gpu_time_cells_are_replaced_folded_once_and_read_by_range(make_store: StoreFactory) -> None:
    """The productivity model's rollups: minute cells saved again replace (the hub writes totals),
    folding adds them into hour cells once, and reads return the cells overlapping a range."""
    store = make_store()
    h = 3600.0 * 1000
    store.save_gpu_time([minute_cell(h, 30.0), minute_cell(h + 60, 60.0), minute_cell(h, 20.0, gpu="1")])
    store.save_gpu_time([minute_cell(h, 60.0, lost=6.0)])  # the same cell counted further: replaced
    store.save_gpu_time([minute_cell(h + 3600, 15.0)])  # the next hour
    assert sorted((c.bucket - h, c.gpu, c.seconds, c.lost) for c in store.gpu_time(h, h + 7200)) == [
        (0.0, "0", 60.0, 6.0),
        (0.0, "1", 20.0, 0.0),
        (60.0, "0", 60.0, 0.0),
        (3600.0, "0", 15.0, 0.0),
    ]
    assert [c.bucket - h for c in store.gpu_time(h + 60, h + 120)] == [60.0]
    assert store.fold_gpu_time(h + 3600) == 3
    assert store.fold_gpu_time(h + 3600) == 0  # folded once: a second fold adds nothing
    store.save_gpu_time([minute_cell(h + 120, 5.0)])  # a late cell of a folded hour adds to it
    assert store.fold_gpu_time(h + 3600) == 1
    cells = sorted(store.gpu_time(h, h + 7200), key=lambda c: (c.res, c.bucket))
    assert [(c.res, c.bucket - h, c.gpu, c.seconds, c.lost) for c in cells] == [
        (60, 3600.0, "0", 15.0, 0.0),
        (3600, 0.0, "", 145.0, 6.0),  # both GPUs of node-0, training for team-a: one hour cell
    ]
    assert store.gpu_time(h + 7200, h + 9000) == []
    assert len(store.gpu_time(h + 3600, float("inf"))) == 1  # what a starting hub asks for
    assert store.compact(h + 3600 + 91 * 86400)["gpu_time"] == 2  # kept for the records' 90 days
    assert store.gpu_time(0, h + 9000) == []
