"""Crashes with real processes: the hub SIGKILLed under concurrent load, an agent killed while it
replays its spool. Every acknowledged batch is present exactly once afterwards."""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import HubProcess, Process, free_port, wait_until

pytestmark = pytest.mark.integration

SENDERS = 4


def probe_batch(sender: int, k: int, base: float) -> bytes:
    ts = base + k * 0.01
    return orjson.dumps(
        {
            "source": f"s{sender}",
            "batch_id": f"s{sender}-{k}",
            "frames": [
                {
                    "ts": ts,
                    "metrics": ["probe_value"],
                    "entities": [{"node": f"s{sender}", "gpu": str(g)} for g in range(4)],
                    "values": [[float(k)]] * 4,
                }
            ],
            "events": [
                {"ts": ts, "kind": "probe", "labels": {"node": f"s{sender}"}, "data": {"s": sender, "k": k}}
            ],
        }
    )


def post(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post("/api/v1/ingest", content=body, headers={"Content-Type": "application/json"})


def test_sigkill_under_concurrent_load_keeps_every_acknowledged_batch_exactly_once(
    tmp_path: Path, hub_factory: Callable[[int, Path], HubProcess]
) -> None:
    port = free_port()
    db = tmp_path / "hub.duckdb"
    hub = hub_factory(port, db)
    hub.wait_ready()
    base = time.time() - 300
    acked: dict[int, list[int]] = {s: [] for s in range(SENDERS)}
    in_flight: dict[int, int] = {}
    dead = threading.Event()

    def sender(s: int) -> None:
        with httpx.Client(base_url=hub.url, timeout=5) as client:
            for k in range(1_000_000):
                in_flight[s] = k
                try:
                    r = post(client, probe_batch(s, k, base))
                except httpx.HTTPError:
                    dead.set()
                    return
                if r.status_code == 200:
                    acked[s].append(k)

    threads = [threading.Thread(target=sender, args=(s,)) for s in range(SENDERS)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(map(len, acked.values())) >= 200, 60, "200 acknowledged batches")
    hub.kill(signal.SIGKILL)
    for t in threads:
        t.join(timeout=10)
    assert dead.is_set()

    hub = hub_factory(port, db)
    hub.wait_ready()
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        # each sender retries what it never got an answer for, and some acknowledged batches
        # (a retry after a lost reply): the acknowledged ones are recognised as duplicates
        for s in range(SENDERS):
            assert post(client, probe_batch(s, in_flight[s], base)).status_code == 200
            for k in acked[s][-3:]:
                assert post(client, probe_batch(s, k, base)).json()["duplicate"] is True
        events = client.get(
            "/api/v1/events",
            params={"kind": "probe", "start": base - 1, "end": base + 1e5, "limit": 100_000},
        ).json()["events"]
    copies = collections.Counter((e["data"]["s"], e["data"]["k"]) for e in events)
    for s in range(SENDERS):
        expected = {*acked[s], in_flight[s]}
        stored = {k for (s2, k), _ in copies.items() if s2 == s}
        assert expected <= stored, f"sender {s} lost {sorted(expected - stored)[:5]}"
    assert max(copies.values()) == 1, [key for key, n in copies.items() if n > 1][:5]


def _rows_and_stamps(url: str, node: str, start: float) -> tuple[int, list[float]]:
    """Stored rows of a node's series, and its distinct timestamps (as many as rows: no duplicates)."""
    end = time.time() + 5
    agg = httpx.get(
        f"{url}/api/v1/aggregate",
        params={"metric": "node_memory_total_bytes", "by": "node", "start": start, "end": end},
        timeout=10,
    ).json()["groups"]
    rows = sum(g["count"] for g in agg if g["group"] == node)
    points = httpx.get(
        f"{url}/api/v1/series",
        params={
            "metric": "node_memory_total_bytes",
            "node": node,
            "start": start,
            "end": end,
            "points": 10_000,
        },
        timeout=10,
    ).json()["points"]
    return rows, [p[0] for p in points]


def test_agent_killed_while_replaying_its_spool_is_stored_once_after_restart(tmp_path: Path) -> None:
    """The hub is away while the agent spools; it comes back, and the agent is SIGKILLed in the
    middle of replaying. Restarted on the same spool, it replays what was not acknowledged; the
    hub keeps one copy of every round. (The agent is the process killed; the hub runs in this
    process so that it starts at once.)"""
    port = free_port()
    db = tmp_path / "hub.duckdb"
    start = time.time() - 1
    args = ["agent", "--hub", f"http://127.0.0.1:{port}", "--node", "n1", "--interval", "0.05"]
    args += ["--spool-dir", str(tmp_path / "spool")]
    agent = Process(args, tmp_path / "agent.log")
    hub: HubServer | None = None
    try:
        wait_until(
            lambda: any((tmp_path / "spool").glob("*.seg")), 30, "the agent to spool, no hub listening"
        )
        time.sleep(1.0)
        hub_up = time.time()
        hub = HubServer(Hub(DuckDBStore(str(db))), "127.0.0.1", port)
        hub.start()
        wait_until(lambda: _rows_and_stamps(hub.url, "n1", start)[0] >= 10, 30, "the replay to start")
        agent.kill(signal.SIGKILL)
        agent.close()
        restarted = time.time()
        agent = Process(args, tmp_path / "agent-2.log")
        # new rounds queue behind the spool: one from after the restart means the replay is done
        wait_until(lambda: max(_rows_and_stamps(hub.url, "n1", start)[1]) > restarted + 0.5, 30, "the replay")
        agent.kill(signal.SIGTERM)
        rows, stamps = _rows_and_stamps(hub.url, "n1", start)
        assert rows == len(stamps), f"{rows - len(stamps)} rounds stored twice"
        assert stamps[0] < hub_up - 1  # rounds spooled before the hub was up are there
    finally:
        agent.close()
        if hub is not None:
            hub.stop()


def test_sigkill_after_acknowledgement_before_the_tables_hold_the_batches(
    tmp_path: Path, hub_factory: Callable[..., HubProcess]
) -> None:
    """A hub acknowledges once a batch is synced in its ingest log; rows move into DuckDB only on
    its tick. Killed between the two (its tick is an hour here), the restarted hub replays every
    acknowledged batch from the log exactly once, and still knows their batch ids."""
    port = free_port()
    db = tmp_path / "hub.duckdb"
    config = tmp_path / "slow-tick.yaml"
    config.write_text("storage: {flush_interval_s: 3600}\n")
    hub = hub_factory(port, db, ["--config", str(config)])
    hub.wait_ready()
    time.sleep(2.5)  # past the first tick's store upkeep (then once a minute), which commits too
    base = time.time() - 300
    with httpx.Client(base_url=hub.url, timeout=10) as client:
        for k in range(30):
            reply = post(client, probe_batch(k % SENDERS, k, base))
            assert reply.status_code == 200 and reply.json()["duplicate"] is False
    hub.kill(signal.SIGKILL)

    hub = hub_factory(port, db)
    hub.wait_ready()
    with httpx.Client(base_url=hub.url, timeout=30) as client:
        health = client.get("/api/v1/health").json()
        assert health["store"]["counters"]["store.log_replayed_batches"] == 30
        for k in (0, 17, 29):
            assert post(client, probe_batch(k % SENDERS, k, base)).json()["duplicate"] is True
        events = client.get(
            "/api/v1/events",
            params={"kind": "probe", "start": base - 1, "end": base + 1e5, "limit": 100_000},
        ).json()["events"]
    copies = collections.Counter(e["data"]["k"] for e in events)
    assert copies == collections.Counter(range(30))
