"""A full disk, for real (a small tmpfs): the hub refuses with 507 and says so in its health, the
agent's spool counts what it drops; both recover when space returns, and nothing acknowledged
before, during or after is lost."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import orjson

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi
from hardening.conftest import fill

JSON = {"Content-Type": "application/json"}


def batch(k: int, base: float) -> dict[str, Any]:
    return {
        "source": "n1",
        "batch_id": f"n1-{k}",
        "frames": [
            {
                "ts": base + k,
                "metrics": ["gpu_power_watts", "gpu_temp_celsius"],
                "entities": [{"node": "n1", "gpu": str(g)} for g in range(64)],
                "values": [[float(k), float(g)] for g in range(64)],
            }
        ],
        "events": [{"ts": base + k, "kind": "probe", "labels": {"node": "n1"}, "data": {"k": k}}],
    }


def stored_ks(client: TestClient, base: float) -> list[int]:
    r = client.get(
        "/api/v1/events", params={"kind": "probe", "start": base - 1, "end": base + 1e4, "limit": 10_000}
    )
    return sorted(e["data"]["k"] for e in r.json()["events"])


def test_hub_on_a_full_disk_answers_507_reports_it_and_recovers(small_disk: Path) -> None:
    db = str(small_disk / "hub.duckdb")
    base = time.time() - 600
    store = DuckDBStore(db)
    client = TestClient(HubApi(Hub(store)).app)
    acked: list[int] = []

    def post(k: int) -> Any:
        r = client.post("/api/v1/ingest", content=orjson.dumps(batch(k, base)), headers=JSON)
        if r.status_code == 200:
            acked.append(k)
        return r

    for k in range(10):
        assert post(k).status_code == 200
    filler = fill(small_disk)
    answers = [post(k) for k in range(10, 20)]
    codes = [r.status_code for r in answers]
    # a batch may still fit in space DuckDB had reserved before the disk filled: then it is acked
    # (and must survive, below); once a write needs new space, every batch is refused with 507
    assert set(codes) <= {200, 507} and codes[-1] == 507, [r.text for r in answers]
    refused = [r for r in answers if r.status_code == 507]
    assert refused[0].json()["field"] == "storage" and "No space left" in refused[0].json()["error"]
    health = client.get("/api/v1/health").json()
    assert health["status"] == "degraded" and health["storage"]["ok"] is False
    assert "No space left" in health["storage"]["error"]
    assert health["counters"]["ingest_storage_failures"] == len(refused)
    assert stored_ks(client, base) == acked  # reads still work; nothing refused was kept
    # the ingest log gave its reserve back, so what it had acknowledged could reach the tables
    assert store.counters.get("store.log_reserve_released") >= 1

    filler.unlink()  # space returns; the senders retry what was refused
    for k in range(10, 30):
        if k not in acked:
            assert post(k).status_code == 200
    health = client.get("/api/v1/health").json()
    assert health["status"] == "ok" and health["storage"] == {
        "ok": True,
        "failing_since": None,
        "error": None,
    }
    assert stored_ks(client, base) == list(range(30))
    store.close()

    with DuckDBStore(db) as again:  # and it was all durable, across the full-disk episode
        events = again.events(base - 1, base + 1e4, "probe", limit=10_000)
        assert sorted(e.data["k"] for e in events) == sorted(acked) == list(range(30))
        power = again.series("gpu_power_watts", {"node": "n1", "gpu": "5"}, base - 1, base + 100, points=1000)
        assert [p.value for p in power] == [float(k) for k in range(30)]


def test_agent_spool_on_a_full_disk_counts_drops_and_recovers(small_disk: Path) -> None:
    counters = Counters()
    spool = Spool(small_disk / "spool", counters=counters, max_bytes=64 << 20)
    record = b"x" * 200_000
    kept = [i for i in range(10) if spool.append(i.to_bytes(4, "big") + record)]
    assert kept == list(range(10))
    filler = fill(small_disk)
    dropped = [i for i in range(10, 20) if not spool.append(i.to_bytes(4, "big") + record)]
    assert dropped == list(range(10, 20))
    assert counters.get("spool_write_errors") >= 10 and counters.get("spool_dropped_batches") == 10
    filler.unlink()
    assert spool.append((20).to_bytes(4, "big") + record)  # space is back: spooling resumes
    replayed = []
    while (rec := spool.peek()) is not None:
        replayed.append(int.from_bytes(rec[:4], "big"))
        assert rec[4:] == record  # a failed write left nothing half-written in front of it
        spool.ack()
    assert replayed == [*range(10), 20]
    spool.close()
