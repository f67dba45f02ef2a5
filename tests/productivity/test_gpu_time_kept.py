"""The productivity model's rollups are kept in the store: a hub reopened on its kept store answers
the same GPU-hours per state for a past range (and Reports can show 30 days after a restart)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.productivity.ledger import HOUR
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.errors import StoreError
from gpuscope.web.api import HubApi

T0 = 1_700_000_000.0 - 1_700_000_000.0 % HOUR  # an hour edge
STEP = 30.0


def frames(ts: float, node_1_up: bool) -> list[Frame]:
    # node-0: GPUs 0-1 serve (busy, held by a job the hub has no training for), GPU 2 is held and
    # idle, GPU 3 is free; node-1's two GPUs are busy until it falls silent after 70 minutes
    entities = [{"node": "node-0", "gpu": str(g), **({"job": "chat"} if g < 3 else {})} for g in range(4)]
    out = [Frame(ts, ["gpu_utilization_percent"], entities, np.array([[99.0], [98.0], [0.0], [0.0]]))]
    if node_1_up:
        others = [{"node": "node-1", "gpu": str(g), "job": "chat"} for g in range(2)]
        out.append(Frame(ts, ["gpu_utilization_percent"], others, np.full((2, 1), 90.0)))
    return out


def run(hub: Hub, start: float, end: float) -> None:
    """Frames every 30 s, the model advanced as the evaluator does, upkeep every ten minutes (the
    hub's is every minute; saves, rollups and folds are the same at either cadence, and each
    upkeep of the store costs as much as twenty frames)."""
    t = start
    while t < end:
        hub.ingest(Batch("agents", frames=frames(t, t < T0 + 70 * 60)))
        hub.settle()  # as the evaluation does first
        hub.productivity.advance(t, [])
        if t % 600 == 0:
            hub.maintain(t)
        t += STEP


def hours_by_state(client: TestClient, start: float, end: float, by: str = "fleet") -> dict[str, Any]:
    r = client.get("/api/v1/productivity", params={"by": by, "start": start, "end": end})
    assert r.status_code == 200, r.text
    return {g["group"]: {s: row["gpu_hours"] for s, row in g["states"].items()} for g in r.json()["groups"]}


def test_a_reopened_hub_answers_the_same_gpu_hours_per_state_for_a_past_range(tmp_path: Path) -> None:
    path = str(tmp_path / "hub.duckdb")
    end = T0 + 3 * HOUR  # past the two hours of minute cells: hour cells are read back too
    hub = Hub(DuckDBStore(path))
    client = TestClient(HubApi(hub, clock=lambda: end).app)
    run(hub, T0, end)
    ranges = [(T0, T0 + HOUR), (T0 + HOUR, T0 + 2 * HOUR), (T0, end), (end - 600, end)]
    before = {r: hours_by_state(client, *r) for r in ranges}
    by_node = hours_by_state(client, T0, end, by="node")
    hub.productivity.save(hub.store)  # what the runtime does when it stops
    hub.store.close()

    fleet = before[(T0, end)]["fleet"]
    assert fleet["productive"] > 0 and fleet["idle_allocated"] > 0 and fleet["idle_unallocated"] > 0
    assert fleet["down"] > 0  # node-1 unreachable from 70 minutes on
    # six GPUs for three hours, less the first interval (a GPU is counted from its first frame on)
    assert math.isclose(sum(fleet.values()), 6 * (3 * HOUR - STEP) / HOUR, abs_tol=1e-3)

    reopened = Hub(DuckDBStore(path))
    try:
        reopened.resume(end, window=0)
        reopened.productivity.load(reopened.store, end)  # read twice: counted once
        client = TestClient(HubApi(reopened, clock=lambda: end).app)
        assert {r: hours_by_state(client, *r) for r in ranges} == before
        assert hours_by_state(client, T0, end, by="node") == by_node
        # it goes on counting onto what it read back, and keeps that too
        run(reopened, end, end + 600)
        later = hours_by_state(client, T0, end + 600)["fleet"]
        # node-0's four GPUs (node-1 never reported to this hub)
        assert math.isclose(sum(later.values()), sum(fleet.values()) + 4 * (600 - STEP) / HOUR, abs_tol=1e-3)
        reopened.productivity.save(reopened.store, end + 600)
    finally:
        reopened.store.close()
    again = Hub(DuckDBStore(path))
    try:
        again.resume(end + 600, window=0)
        assert again.productivity.gpu_hours(T0, end + 600) == later
    finally:
        again.store.close()


def test_a_fresh_hub_on_a_fresh_store_starts_empty(tmp_path: Path) -> None:
    hub = Hub(DuckDBStore(str(tmp_path / "new.duckdb")))
    try:
        hub.resume(T0, window=0)
        assert hub.productivity.gpu_hours(0, T0 + HOUR) == {}
    finally:
        hub.store.close()


def test_cells_a_failed_save_could_not_write_are_written_by_the_next(tmp_path: Path) -> None:
    hub = Hub(DuckDBStore(str(tmp_path / "a.duckdb")))
    run(hub, T0, T0 + 3 * HOUR)  # minute cells folded into hours in memory since the last save too
    hub.store.close()
    for t in range(int(T0 + 3 * HOUR), int(T0 + 3 * HOUR + 600), 30):
        hub.productivity.observe(Batch("agents", frames=frames(float(t), False)))
        hub.productivity.advance(float(t), [])
    lost_store = DuckDBStore(str(tmp_path / "lost.duckdb"))
    lost_store.close()
    with pytest.raises(StoreError):
        hub.productivity.save(lost_store)  # the store is closed: nothing written
    kept = DuckDBStore(str(tmp_path / "b.duckdb"))
    try:
        assert hub.productivity.save(kept) > 0
        seconds = sum(c.seconds for c in kept.gpu_time(T0 + 3 * HOUR, T0 + 4 * HOUR))
        assert math.isclose(seconds, 6 * 570.0, abs_tol=1e-6)  # six GPUs (two down), to the last frame
        assert hub.productivity.save(kept) == 0  # nothing left over
    finally:
        kept.close()
