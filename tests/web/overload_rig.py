"""A real hub driven past its capacity, for the overload tests: the hub on a loopback port with the
overload settings given, and a flood of senders that name nobody and never wait."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx

from detect.rig import FakeCluster
from gpuscope.hub import Hub
from gpuscope.ingest.overload import OverloadMonitor, OverloadSettings
from gpuscope.ingest.payload import encode_batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer


@contextlib.contextmanager
def hub_server(settings: OverloadSettings) -> Iterator[HubServer]:
    hub = Hub(DuckDBStore(":memory:"))
    hub.overload = OverloadMonitor(settings)
    server = HubServer(hub, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Flood:
    """Senders offering far more than the hub is allowed to take, each a node of its own that names
    nobody and never waits; ``refused``: the Retry-After of every refusal they got."""

    def __init__(self, url: str, senders: int) -> None:
        self.url = f"{url}/api/v1/ingest"
        self.refused: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(k,), daemon=True) for k in range(senders)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _send(self, k: int) -> None:
        cluster = FakeCluster(nodes=1, gpus=8, seed=k)
        n = 0
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                batch = cluster.batch(time.time(), f"flood-{k}")
                batch.batch_id = f"flood-{k}:{n}"
                n += 1
                try:
                    reply = client.post(
                        self.url, content=encode_batch(batch), headers={"Content-Type": "application/json"}
                    )
                except httpx.HTTPError:
                    continue
                if reply.status_code == 503:
                    assert reply.headers["Retry-After"].isdigit()
                    self.refused.append(int(reply.headers["Retry-After"]))


@contextlib.contextmanager
def flooding(url: str, senders: int) -> Iterator[Flood]:
    """A :class:`Flood` of ``senders`` on the hub at ``url`` while the block runs."""
    flood = Flood(url, senders)
    flood.start()
    try:
        yield flood
    finally:
        flood.stop()
