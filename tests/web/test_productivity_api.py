"""/api/v1/productivity and node drains over HTTP: the model's figures, refusals naming the field,
token auth for writes, and a drained node's GPU time counted as maintenance."""

from __future__ import annotations

import warnings

import numpy as np

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.hub import Hub
from gpuscope.model import Batch, Event, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi
from gpuscope.web.productivity_api import parse_range

TOKEN = "a-test-token-of-some-length"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_frame(ts: float, node: str, job: str | None) -> Frame:
    entities = [{"node": node, "gpu": str(g), **({"job": job} if job else {})} for g in range(2)]
    return Frame(ts, ["gpu_utilization_percent"], entities, np.array([[0.0], [0.0]]))


def test_productivity_by_node_and_a_drain_that_counts_as_maintenance() -> None:
    clock = Clock()
    hub = Hub(DuckDBStore(":memory:"), price_per_gpu_hour=3.6)
    client = TestClient(HubApi(hub, tokens=[TOKEN], clock=clock).app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        assert client.post("/api/v1/nodes/node-1/drain", json={"for_seconds": 60}).status_code == 401
        bad = client.post("/api/v1/nodes/node-1/drain", json={"for_seconds": -5}, headers=auth)
        assert bad.status_code == 400 and bad.json()["field"] == "for_seconds"
        ok = client.post(
            "/api/v1/nodes/node-1/drain", json={"for_seconds": 60, "reason": "firmware"}, headers=auth
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["until"] == clock.now + 60 and ok.json()["reason"] == "firmware"
        start = clock.now
        for _ in range(30):
            clock.now += 1
            hub.ingest(Batch("node-0", frames=[gpu_frame(clock.now, "node-0", None)]))
            hub.ingest(Batch("node-1", frames=[gpu_frame(clock.now, "node-1", None)]))
            hub.evaluate(clock.now)
        drains = client.get("/api/v1/nodes/drains", headers=auth).json()["drains"]
        assert [d["node"] for d in drains] == ["node-1"]
        doc = client.get("/api/v1/productivity?by=node&range=1h", headers=auth).json()
        assert doc["by"] == "node" and doc["price_per_gpu_hour"] == 3.6
        groups = {g["group"]: g for g in doc["groups"]}
        maintenance = groups["node-1"]["states"]["maintenance"]
        assert round(maintenance["gpu_hours"] * 3600) == 2 * 29
        assert maintenance["causes"]["drained"]["owner"] == "platform"
        assert round(groups["node-0"]["states"]["idle_unallocated"]["gpu_hours"] * 3600) == 2 * 29
        assert doc["now"] == {"maintenance": 2, "idle_unallocated": 2}
        window = client.get(f"/api/v1/productivity?start={start}&end={start + 10}", headers=auth).json()
        assert window["start"] == start and window["end"] == start + 10
        gpus = client.get("/api/v1/productivity/gpus", headers=auth).json()["gpus"]
        assert {(g["node"], g["state"]) for g in gpus} == {
            ("node-0", "idle_unallocated"),
            ("node-1", "maintenance"),
        }
        assert client.delete("/api/v1/nodes/node-1/drain", headers=auth).status_code == 200
        assert client.delete("/api/v1/nodes/node-1/drain", headers=auth).status_code == 404
    finally:
        hub.store.close()


def test_productivity_refusals_name_the_field() -> None:
    hub = Hub(DuckDBStore(":memory:"))
    client = TestClient(HubApi(hub, clock=lambda: 1000.0).app)
    try:
        for query, field in (
            ("by=rack", "by"),
            ("range=2y", "range"),
            ("range=401d", "range"),
            ("start=5&end=1", "start"),
            ("end=nan", "end"),
        ):
            r = client.get(f"/api/v1/productivity?{query}")
            assert r.status_code == 400 and r.json()["field"] == field, (query, r.text)
    finally:
        hub.store.close()


def test_ranges_parse_to_seconds() -> None:
    assert parse_range("90s") == 90 and parse_range("15m") == 900 and parse_range("30d") == 30 * 86400


def kubelet_frame(ts: float) -> Frame:
    """The kubelet collector's round on node-0: GPUs 0-2 allocatable, 0 and 1 held by pods whose
    metadata names their team (collect/kubelet.py with --kube-api)."""
    base = {"node": "node-0"}
    entities = [{**base, "gpu": str(g), "uuid": f"GPU-{g}"} for g in range(3)] + [
        {**base, "gpu": "0", "uuid": "GPU-0", "owner": "ml/trainer-0/pytorch", "pod": "ml/trainer-0",
         "namespace": "ml", "container": "pytorch", "workload": "PyTorchJob/bert", "team": "nlp"},
        {**base, "gpu": "1", "uuid": "GPU-1", "owner": "research/notebook-0/jupyter",
         "pod": "research/notebook-0", "namespace": "research", "container": "jupyter", "team": "vision"},
    ]  # fmt: skip
    nan = float("nan")
    values = np.array([[1.0, nan]] * 3 + [[nan, 1.0]] * 2)
    return Frame(ts, ["gpu_allocatable", "gpu_owner_allocated"], entities, values)


def test_productivity_by_team_takes_the_team_from_the_pod_metadata() -> None:
    clock = Clock()
    hub = Hub(DuckDBStore(":memory:"))
    client = TestClient(HubApi(hub, clock=clock).app)
    try:
        for _ in range(30):
            clock.now += 1
            gpus = Frame(
                clock.now,
                ["gpu_utilization_percent"],
                [
                    # the trainer runs without the SDK: its job comes from the process, its team from the pod
                    {"node": "node-0", "gpu": "0", "job": "bert", "pod": "ml/trainer-0", "namespace": "ml"},
                    {"node": "node-0", "gpu": "1"},  # the notebook holds it and runs nothing
                    {"node": "node-0", "gpu": "2"},  # free
                ],
                np.array([[95.0], [0.0], [0.0]]),
            )
            hub.ingest(Batch("node-0", frames=[kubelet_frame(clock.now), gpus]))
            hub.evaluate(clock.now)
        doc = client.get("/api/v1/productivity?by=team&range=1h").json()
        teams = {
            g["group"]: {k: round(s["gpu_hours"] * 3600) for k, s in g["states"].items() if s["gpu_hours"]}
            for g in doc["groups"]
        }
        # GPU 2 is nobody's: no team (it stays in the fleet's idle_unallocated)
        assert teams == {"nlp": {"productive": 29}, "vision": {"idle_allocated": 29}}
        vision = next(g for g in doc["groups"] if g["group"] == "vision")
        assert list(vision["states"]["idle_allocated"]["causes"]) == ["idle_job"]
        # an SDK's own team (the pod's downward API) still wins for its job
        hub.ingest(Batch("sdk", events=[Event(clock.now, "job_started", {"job": "bert"}, {"team": "llm"})]))
        clock.now += 1
        hub.ingest(Batch("node-0", frames=[kubelet_frame(clock.now)]))
        hub.settle()  # as the next evaluation does first
        assert hub.productivity.jobs["bert"].team == "llm"
    finally:
        hub.store.close()


def test_a_read_sees_what_every_acknowledged_batch_taught_the_hub_without_an_evaluation() -> None:
    clock = Clock()
    hub = Hub(DuckDBStore(":memory:"))
    client = TestClient(HubApi(hub, tokens=[TOKEN], clock=clock).app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        body = {
            "source": "agent-node-7",
            "frames": [
                {
                    "ts": clock.now,
                    "metrics": ["gpu_utilization_percent"],
                    "entities": [{"node": "node-7", "gpu": "0"}],
                    "values": [[50.0]],
                }
            ],
        }
        assert client.post("/api/v1/ingest", json=body, headers=auth).status_code == 200
        assert hub.observing.backlog()[0] == 1  # acknowledged; the request did not observe it
        assert ("node-7", "0") not in hub.productivity.gpus
        r = client.get("/api/v1/productivity/gpus", headers=auth)
        assert r.status_code == 200, r.text
        assert hub.observing.backlog()[0] == 0 and ("node-7", "0") in hub.productivity.gpus
    finally:
        hub.store.close()
