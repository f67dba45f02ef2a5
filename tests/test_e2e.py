"""End to end with real processes on loopback: a hub, agents, an outage, a SIGKILL."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from support import HubProcess, Process, free_port, wait_until

pytestmark = pytest.mark.integration


def _node_series(
    url: str,
    node: str,
    metric: str = "node_memory_total_bytes",
    start: float | None = None,
    end: float | None = None,
) -> list[float]:
    """Timestamps of one node's series (buckets far finer than the sampling interval)."""
    now = time.time()
    r = httpx.get(
        f"{url}/api/v1/series",
        params={
            "metric": metric,
            "node": node,
            "start": start or now - 900,
            "end": end or now + 60,
            "points": 10_000,
        },
        timeout=10,
    )
    r.raise_for_status()
    return [p[0] for p in r.json()["points"]]


def test_two_agents_reach_the_hub_and_an_outage_loses_nothing(
    tmp_path: Path, hub_factory: type[HubProcess]
) -> None:
    """Two agents' samples and start events reach the hub; then the hub is away for 12 s (the
    agents' retries back off to 8 s meanwhile): each agent spools and replays in order, and no
    round is missing. (One hub and one pair of agents for both checks: they were two tests.)"""
    port = free_port()
    db = tmp_path / "hub.duckdb"
    hub = hub_factory(port, db)
    hub.wait_ready()
    interval = 0.5
    names = ("alpha", "beta")
    agents = [
        Process(
            [
                "agent",
                "--hub",
                hub.url,
                "--node",
                name,
                "--interval",
                str(interval),
                "--spool-dir",
                str(tmp_path / name),
            ],
            tmp_path / f"{name}.log",
        )
        for name in names
    ]
    try:
        wait_until(
            lambda: all(len(_node_series(hub.url, n)) >= 4 for n in names),
            30,
            "both agents' samples in the hub",
        )
        snapshot = httpx.get(f"{hub.url}/api/v1/snapshot", timeout=10).json()["entities"]
        nodes = {row["labels"].get("node") for row in snapshot}
        assert {"alpha", "beta"} <= nodes
        row = next(r for r in snapshot if r["labels"] == {"node": "alpha"})
        assert row["values"]["node_memory_total_bytes"] > 0
        events = httpx.get(
            f"{hub.url}/api/v1/events", params={"kind": "agent_started", "start": 0, "end": 4e9}
        ).json()["events"]
        assert {e["labels"]["node"] for e in events} >= {"alpha", "beta"}

        first = {n: _node_series(hub.url, n)[0] for n in names}
        hub.kill(signal.SIGTERM)
        threading.Event().wait(12)
        hub = hub_factory(port, db)
        hub.wait_ready()
        # rounds made by the time the hub was back
        rounds = {n: int((time.time() - first[n]) / interval) for n in names}
        wait_until(
            lambda: all(len(_node_series(hub.url, n)) >= rounds[n] + 4 for n in names),
            40,
            "the spools to replay",
        )
        for agent in agents:
            agent.kill(signal.SIGTERM)
        for n in names:
            ts = _node_series(hub.url, n)
            gaps = [b - a for a, b in itertools.pairwise(ts)]
            assert max(gaps) < 2.5 * interval, f"{n}: a gap of {max(gaps):.2f} s: samples were lost"
            assert ts == sorted(ts), n
    finally:
        for agent in agents:
            agent.close()


def test_sigkill_loses_nothing_acknowledged(tmp_path: Path, hub_factory: type[HubProcess]) -> None:
    port = free_port()
    db = tmp_path / "hub.duckdb"
    hub = hub_factory(port, db)
    hub.wait_ready()
    acked: list[int] = []
    stop = threading.Event()

    base = time.time() - 300  # inside raw retention, which the hub applies from its first minute

    def sender() -> None:
        with httpx.Client(base_url=hub.url, timeout=5) as client:
            for k in range(100_000):
                if stop.is_set():
                    return
                body = {
                    "source": "probe",
                    "batch_id": f"probe-{k}",
                    "frames": [
                        {
                            "ts": base + k * 0.01,
                            "metrics": ["probe_value"],
                            "entities": [{"node": "p", "gpu": str(g)} for g in range(8)],
                            "values": [[float(k)]] * 8,
                        }
                    ],
                    "events": [
                        {"ts": base + k * 0.01, "kind": "probe", "labels": {"node": "p"}, "data": {"k": k}}
                    ],
                }
                try:
                    r = client.post(
                        "/api/v1/ingest",
                        content=orjson.dumps(body),
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    acked.append(k)

    thread = threading.Thread(target=sender)
    thread.start()
    wait_until(lambda: len(acked) >= 200, 60, "200 acknowledged batches")
    hub.kill(signal.SIGKILL)
    stop.set()
    thread.join(timeout=10)
    hub = hub_factory(port, db)
    hub.wait_ready()
    events = httpx.get(
        f"{hub.url}/api/v1/events",
        params={"kind": "probe", "start": base - 1, "end": base + 1000, "limit": 100_000},
        timeout=30,
    ).json()["events"]
    stored = {e["data"]["k"] for e in events}
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged batches lost, e.g. {sorted(missing)[:5]}"
    values = _node_series(
        hub.url, "p", "probe_value", start=base - 0.005, end=base + max(acked) * 0.01 + 0.005
    )
    assert len(values) >= len(acked)
