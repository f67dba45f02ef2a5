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


def test_hub_and_two_agents(tmp_path: Path, hub_factory: type[HubProcess]) -> None:
    port = free_port()
    hub = hub_factory(port, tmp_path / "hub.duckdb")
    hub.wait_ready()
    agents = [
        Process(
            [
                "agent",
                "--hub",
                hub.url,
                "--node",
                name,
                "--interval",
                "0.25",
                "--spool-dir",
                str(tmp_path / name),
            ],
            tmp_path / f"{name}.log",
        )
        for name in ("alpha", "beta")
    ]
    try:
        wait_until(
            lambda: all(len(_node_series(hub.url, n)) >= 4 for n in ("alpha", "beta")),
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
    finally:
        for a in agents:
            a.close()


def test_hub_outage_loses_nothing(tmp_path: Path, hub_factory: type[HubProcess]) -> None:
    """The hub is away for 12 s (the agent's retries back off to 8 s meanwhile); the agent spools
    and replays in order; no round is missing."""
    port = free_port()
    db = tmp_path / "hub.duckdb"
    hub = hub_factory(port, db)
    hub.wait_ready()
    interval = 0.5
    agent = Process(
        [
            "agent",
            "--hub",
            hub.url,
            "--node",
            "n1",
            "--interval",
            str(interval),
            "--spool-dir",
            str(tmp_path / "spool"),
        ],
        tmp_path / "agent.log",
    )
    try:
        wait_until(lambda: len(_node_series(hub.url, "n1")) >= 3, 20, "first samples")
        first = _node_series(hub.url, "n1")[0]
        hub.kill(signal.SIGTERM)
        threading.Event().wait(12)
        hub = hub_factory(port, db)
        hub.wait_ready()
        rounds = int((time.time() - first) / interval)  # made by the time the hub was back
        wait_until(lambda: len(_node_series(hub.url, "n1")) >= rounds + 4, 40, "the spool to replay")
        agent.kill(signal.SIGTERM)
        ts = _node_series(hub.url, "n1")
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        assert max(gaps) < 2.5 * interval, f"a gap of {max(gaps):.2f} s: samples were lost"
        assert ts == sorted(ts)
    finally:
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
