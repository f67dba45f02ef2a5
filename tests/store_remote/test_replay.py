"""Replay (detector warm-up's read) returns what was stored, the same on every backend: frames with
their own timestamps and values, events and training records, in time order, limited by node/job."""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import pytest

from gpuscope.model import Batch, Event, Frame, TrainingRecord
from gpuscope.store.remote.prom_store import PromStore
from store_remote.tsdbs import StoreFactory

pytestmark = pytest.mark.integration

T0 = float(int(time.time()) - 300)  # recent: Prometheus refuses samples far older than its newest


def _batch(k: int, node: str, job: str) -> Batch:
    gpu = {"node": node, "gpu": "0", "job": job}
    return Batch(
        node,
        frames=[
            Frame(
                T0 + k,
                ["gpu_utilization_percent", "node_cpu_utilization_percent"],
                [gpu, {"node": node}],
                np.array([[50.0 + k, np.nan], [np.nan, 10.0 + k]]),
            )
        ],
        events=[Event(T0 + k, "heartbeat", {"job": job, "rank": "0"}, {"step": k})],
        training=[TrainingRecord(T0 + k, job, 0, k, {"loss": 2.0 - k / 10})],
        batch_id=f"{node}-{k}",
    )


def test_replay_round_trips_frames_events_and_training(make_store: StoreFactory) -> None:
    store = make_store()
    for k in range(4):
        store.append(_batch(k, "node-a", "job-a"))
        store.append(_batch(k, "node-b", "job-b"))

    out = list(store.replay(T0 + 1, T0 + 3))
    assert [b.frames[0].ts for b in out] == [T0 + 1, T0 + 2, T0 + 3]
    first = out[0]
    rows = {
        (f.entities[i]["node"], f.entities[i].get("gpu")): {
            m: v for m, v in zip(f.metrics, f.values[i].tolist(), strict=True) if v == v
        }
        for f in first.frames
        for i in range(len(f.entities))
    }
    assert rows[("node-a", "0")]["gpu_utilization_percent"] == 51.0
    assert rows[("node-b", None)] == {"node_cpu_utilization_percent": 11.0}
    gpu_labels = next(e for f in first.frames for e in f.entities if e.get("gpu") == "0")
    assert gpu_labels["job"] in {"job-a", "job-b"}  # attribution comes back with the row
    assert sorted(e.labels["job"] for e in first.events) == ["job-a", "job-b"]
    assert sorted((r.job, r.step, r.metrics["loss"]) for r in first.training) == [
        ("job-a", 1, 1.9),
        ("job-b", 1, 1.9),
    ]

    only_a = list(store.replay(T0, T0 + 3, nodes=["node-a"], jobs=["job-a"]))
    assert len(only_a) == 4
    for b in only_a:
        assert {e["node"] for f in b.frames for e in f.entities} == {"node-a"}
        assert [r.job for r in b.training] == ["job-a"]
        assert [e.labels["job"] for e in b.events] == ["job-a"]
    just_node = list(store.replay(T0, T0 + 3, nodes=["node-b"]))
    assert all(not b.training and not b.events for b in just_node)  # node-b's job was not asked for
    assert len(just_node) == 4


def _batches_as_data(out: list[Batch]) -> list[tuple[object, ...]]:
    """What the detectors see of replayed batches: per batch its time, rows, events and records."""
    return [
        (
            sorted(f.ts for f in b.frames),
            sorted(
                (f.ts, sorted(e.items()), m, v)
                for f in b.frames
                for i, e in enumerate(f.entities)
                for m, v in zip(f.metrics, f.values[i].tolist(), strict=True)
                if v == v
            ),
            sorted((e.ts, e.kind, sorted(e.labels.items())) for e in b.events),
            sorted((r.ts, r.job, r.step) for r in b.training),
        )
        for b in out
    ]


def test_replay_read_in_chunks_returns_the_batches_of_one_read(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """A takeover's warm-up reads its window a chunk at a time (memory); the detectors see the
    same batches whether a chunk edge falls on a timestamp, between two, or not at all."""
    if request.node.callspec.params["make_store"] == "duckdb":
        pytest.skip("chunked reads are the remote backend's")
    store = cast(PromStore, make_store())  # the remote backends make one
    for k in range(8):
        store.append(_batch(k, "node-a", "job-a"))
        store.append(_batch(k, "node-b", "job-b"))
    store.replay_chunk_s = 3600.0
    whole = list(store.replay(T0, T0 + 7))
    assert len(whole) == 8
    for chunk in (1.0, 1.5, 0.25):
        store.replay_chunk_s = chunk
        assert _batches_as_data(list(store.replay(T0, T0 + 7))) == _batches_as_data(whole)
        only_a = list(store.replay(T0, T0 + 7, nodes=["node-a"], jobs=["job-a"]))
        store.replay_chunk_s = 3600.0
        assert _batches_as_data(only_a) == _batches_as_data(
            list(store.replay(T0, T0 + 7, nodes=["node-a"], jobs=["job-a"]))
        )
