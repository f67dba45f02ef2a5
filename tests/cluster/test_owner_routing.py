"""Senders go to their shard's owner: two real ``gpuscope hub`` processes on a real PostgreSQL, an
agent's real :class:`~gpuscope.agent.sender.Sender` configured with the hub that does *not* own
its node. After the first answer its batches stop being forwarded; after the owner is SIGKILLed
the sender moves to the survivor (the new owner), and every batch any hub acknowledged is stored."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from gpuscope.agent.route import OWNER_HEADER
from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.cluster.ring import shard_of
from gpuscope.counters import Counters
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch, Event, Frame
from support import HubProcess, free_port, wait_until

pytestmark = pytest.mark.integration

SHARDS = 16
KIND = "owner_routing_mark"


def _config(tmp: Path, dsn: str, name: str) -> Path:
    config = {
        "cluster": {
            "postgres_dsn": dsn,
            "hub_id": f"hub-{name}",
            "peer_token": "peer-token-for-the-test-0123",
            "shards": SHARDS,
            "lease_s": 2,
        }
    }
    path = tmp / f"hub-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _cluster(hub: HubProcess) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{hub.url}/api/v1/health", timeout=2).json()["cluster"]
    return doc


def _ops(hub: HubProcess) -> dict[str, float]:
    """The hub's counted operations, from its own /metrics."""
    text = httpx.get(f"{hub.url}/metrics", timeout=2).text
    found = re.findall(r'^gpuscope_hub_operations_total\{name="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def _batch(node: str, seq: int) -> Batch:
    now = time.time()
    frame = Frame(now, ["node_load1"], [{"node": node}], np.array([[float(seq)]]))
    event = Event(now, KIND, {"node": node}, {"seq": seq})
    return Batch(f"agent-{node}", frames=[frame], events=[event], batch_id=f"{node}:boot:{seq}")


def _stored_seqs(hub: HubProcess, node: str) -> list[int]:
    now = time.time()
    params = {"start": now - 600, "end": now + 60, "kind": KIND, "node": node, "limit": 10_000}
    rows = httpx.get(f"{hub.url}/api/v1/events", params=params, timeout=5).json()["events"]
    return [int(row["data"]["seq"]) for row in rows]


def test_sender_follows_the_owner_and_moves_on_when_it_dies(
    postgres_dsn: str, tmp_path: Path, hub_factory: type[HubProcess]
) -> None:
    ports = {"a": free_port(), "b": free_port()}
    configs = {name: _config(tmp_path, postgres_dsn, name) for name in ports}
    a, b = (
        hub_factory(ports[n], tmp_path / f"hub-{n}.duckdb", ["--config", str(configs[n])]) for n in ("a", "b")
    )
    for hub in (a, b):
        hub.wait_ready()
    wait_until(
        lambda: all(len(_cluster(h)["members"]) == 2 and _cluster(h)["owned_shards"] for h in (a, b)),
        20,
        "two members, each owning shards",
    )
    owned_by_b = set(_cluster(b)["owned_shards"])
    node = next(f"node-{i}" for i in range(1000) if shard_of("node", f"node-{i}", SHARDS) in owned_by_b)

    counters = Counters()
    sender = Sender(a.url, spool=Spool(tmp_path / "spool", counters=counters, fsync=False), counters=counters)
    seq = 0

    def send(n: int) -> None:
        nonlocal seq
        for _ in range(n):
            sender.submit(encode_batch(_batch(node, seq)), 1)
            seq += 1
            time.sleep(0.05)

    try:
        # the first answer (from a, which forwards the batch) names b, the owner
        first = httpx.post(f"{a.url}/api/v1/ingest", content=encode_batch(_batch(node, -1)))
        assert first.status_code == 200 and first.headers[OWNER_HEADER] == b.url

        send(20)
        assert sender.url == f"{b.url}/api/v1/ingest"
        assert counters.get("hub_owner_moves") == 1
        ops_a, ops_b = _ops(a), _ops(b)
        assert ops_a.get("cluster_batches_forwarded") == 2  # the probe above and the sender's first
        assert ops_b.get("cluster_batches_local") == 19  # every later batch went straight to b
        assert "cluster_batches_forwarded" not in ops_b
        # the owner took both forwarded parts (binary frames, several to a request when queued)
        wait_until(lambda: _ops(a).get("cluster_forwarded") == 2, 5, "the owner to take both parts")
        assert "cluster_forward_failed" not in _ops(a)

        b.kill(signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sender.url != f"{a.url}/api/v1/ingest":
            send(1)
        wait_until(lambda: len(_cluster(a)["owned_shards"]) == SHARDS, 15, "the survivor to own every shard")
        send(15)
        wait_until(lambda: (sender.flush(), sender.backlog == 0)[1], 20, "the spool to drain")
        assert sender.url == f"{a.url}/api/v1/ingest"
        assert counters.get("hub_fallbacks") >= 1
        forwarded_after = _ops(a).get("cluster_batches_forwarded")
        send(5)
        assert _ops(a).get("cluster_batches_forwarded") == forwarded_after  # a owns it now: no forward
    finally:
        sender.close()

    # b's acknowledged batches survived its SIGKILL: it comes back on the same store
    b2 = hub_factory(free_port(), tmp_path / "hub-b.duckdb", ["--config", str(configs["b"])])
    b2.wait_ready()
    stored = _stored_seqs(a, node) + _stored_seqs(b2, node)
    assert counters.get("batches_sent") == seq  # the spool drained: every batch was acknowledged
    assert set(range(seq)) <= set(stored), sorted(set(range(seq)) - set(stored))
    # each stored once, but for one whose answer the SIGKILL may have cut off (retried on a)
    assert len(stored) - len(set(stored)) <= 1
