"""A real hub driven past its capacity: it sheds with 503 + Retry-After, raises one hub_overloaded,
blames no sender for its own lag, and catches up without losing or duplicating a batch."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from detect.rig import FakeCluster, FakeJob
from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.ingest.overload import SENDER_HEADER, OverloadSettings
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch
from gpuscope.rules import HUB_OVERLOADED
from gpuscope.web.server import HubServer
from support import wait_until
from web.overload_rig import flooding, hub_server

NODES = 4
FLOODERS = 24
JSON = {"Content-Type": "application/json"}


class _Fleet:
    """Agents (one real Sender each, spooling) and one training job's SDK, one batch a second."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.cluster = FakeCluster(nodes=NODES, gpus=2)
        self.job = FakeJob.on(self.cluster.names, 2, start=time.time())
        self.cluster.allocate(self.job.name, self.job.placement)
        self.counters = Counters()
        names = [*self.cluster.names, "sdk"]
        self.senders = {
            name: Sender(url, spool=Spool(tmp / name, fsync=False), counters=self.counters) for name in names
        }
        self.sent: dict[str, int] = dict.fromkeys(names, 0)
        self.records = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def _submit(self, name: str, batch: Batch) -> None:
        batch.batch_id = f"{name}:{self.sent[name]}"
        self.sent[name] += 1
        self.senders[name].submit(encode_batch(batch))

    def run(self) -> None:
        while not self.stop.wait(1.0 - time.time() % 1.0):
            t = time.time()
            with self.lock:
                for node in self.cluster.names:
                    self._submit(node, self.cluster.batch(t, node))
                batch = self.job.batch(t)
                if batch is not None:
                    self.records += len(batch.training)
                    self._submit("sdk", batch)

    def drained(self) -> bool:
        with self.lock:
            for sender in self.senders.values():
                sender.flush()
            return all(s.backlog == 0 for s in self.senders.values())


@pytest.fixture
def server() -> Iterator[HubServer]:
    with hub_server(OverloadSettings(max_in_flight=8, max_lag_s=1.0, retry_after_s=1.0)) as srv:
        yield srv


def test_a_hub_past_its_capacity_sheds_alerts_once_blames_nobody_and_catches_up(
    server: HubServer, tmp_path: Path
) -> None:
    hub = server.hub
    fleet = _Fleet(server.url, tmp_path)
    beat = threading.Thread(target=fleet.run, daemon=True)
    beat.start()
    try:
        time.sleep(6)  # the detectors learn every sender's period; the hub keeps up
        assert hub.counters.get("ingest_shed_requests") == 0
        with flooding(server.url, FLOODERS) as flood:
            wait_until(lambda: any(a.rule == HUB_OVERLOADED for a in hub.firing()), 20, "hub_overloaded")
            time.sleep(8)  # longer than any sender's silence threshold
        refused = flood.refused
        assert refused and all(1 <= r <= 2 for r in refused)  # shed with Retry-After
        assert fleet.counters.get("send_failures") > 0  # the fleet was refused too, and spooled
        wait_until(fleet.drained, 60, "the fleet's spools to drain")
        wait_until(lambda: not hub.overload.behind(time.time()), 30, "the hub to catch up")
        time.sleep(6)  # every sender's silence threshold after the hub caught up
    finally:
        fleet.stop.set()
        beat.join(5)
    assert fleet.drained()

    alerts = hub.store.alerts(False, 10_000)
    assert [a.rule for a in alerts if a.rule == HUB_OVERLOADED] == [HUB_OVERLOADED]
    overloaded = next(a for a in alerts if a.rule == HUB_OVERLOADED)
    assert overloaded.severity == "P2" and overloaded.owner == "platform"
    assert overloaded.entity == {"hub": f"{socket.gethostname()}:{server.port}"}
    blamed = [
        a
        for a in alerts
        if a.rule in {"node_unreachable", "rank_lost", "training_stalled"}
        and not a.entity.get("node", "").startswith("flood-")
    ]
    assert blamed == []

    # every batch of the fleet stored once: one point per batch for each node, every record once
    now = time.time()
    for node in fleet.cluster.names:
        points = hub.store.series("node_load1", {"node": node}, now - 600, now + 1, points=10_000)
        assert len(points) == fleet.sent[node], node
        assert len({p.ts for p in points}) == len(points)
    stored = hub.store.training(fleet.job.name, now - 600, now + 1)
    assert len(stored) == fleet.records
    assert len({(r.rank, r.step) for r in stored}) == len(stored)
    health = httpx.get(f"{server.url}/api/v1/health").json()
    assert health["overload"]["shed_requests"] >= len(refused) and not health["overload"]["behind"]


def test_the_hub_measures_its_own_event_loop_while_it_serves(server: HubServer) -> None:
    overload = server.hub.overload
    wait_until(lambda: overload.delay.loop_probes >= 3, 10, "the event loop probed")
    status = httpx.get(f"{server.url}/api/v1/health").json()["overload"]
    assert status["event_loop_probes"] >= 3 and 0 <= status["event_loop_lag_seconds"] < 2
    assert 0 <= status["delay_seconds"] < 2  # the one measure the silence verdicts allow for


class _LatePath:
    """The fleet's batches reach the hub through a path that is behind (a starved connection pool,
    a congested link): they queue in the order they were produced and go out a few at a time, so
    every sender is heard only now and then and ever later; then the path clears and the backlog
    arrives in a burst, more at once than the hub admits."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/api/v1/ingest"
        self.cluster = FakeCluster(nodes=NODES, gpus=2)
        self.job = FakeJob.on(self.cluster.names, 2, start=time.time())
        self.cluster.allocate(self.job.name, self.job.placement)
        self.queue: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.produced = 0
        self.acked = 0
        self.refused = 0

    def produce(self, t: float) -> None:
        batches = [(f"node={n}", self.cluster.batch(t, n)) for n in self.cluster.names]
        job = self.job.batch(t)
        if job is not None:
            batches.append((f"job={self.job.name}", job))
        with self.lock:
            for sender, batch in batches:
                batch.batch_id = f"{sender}:{self.produced}"
                self.produced += 1
                self.queue.append((sender, encode_batch(batch)))

    def take(self) -> tuple[str, bytes] | None:
        with self.lock:
            return self.queue.pop(0) if self.queue else None

    def deliver(self, client: httpx.Client, item: tuple[str, bytes]) -> None:
        """Post until acknowledged, honouring Retry-After, as an agent does."""
        sender, body = item
        headers = {**JSON, SENDER_HEADER: sender}
        while True:
            reply = client.post(self.url, content=body, headers=headers)
            if reply.status_code == 200:
                with self.lock:
                    self.acked += 1
                return
            assert reply.status_code in (429, 503), reply.text
            with self.lock:
                self.refused += 1
            time.sleep(float(reply.headers.get("Retry-After", "1")))

    def trickle(self, seconds: float, every: float) -> None:
        """Produce a batch per sender each second, deliver one batch every ``every`` seconds."""
        end = time.time() + seconds
        next_delivery = time.time()
        with httpx.Client(timeout=30) as client:
            while time.time() < end:
                self.produce(time.time())
                while next_delivery <= time.time():
                    item = self.take()
                    if item is not None:
                        self.deliver(client, item)
                    next_delivery += every
                time.sleep(1.0 - time.time() % 1.0)

    def burst(self, workers: int) -> None:
        def drain() -> None:
            with httpx.Client(timeout=30) as client:
                while (item := self.take()) is not None:
                    self.deliver(client, item)

        threads = [threading.Thread(target=drain, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)


def test_a_backlog_that_arrives_late_and_in_a_burst_blames_no_sender(tmp_path: Path) -> None:
    with hub_server(OverloadSettings(max_in_flight=2, max_lag_s=0.5, retry_after_s=1.0)) as server:
        hub = server.hub
        path = _LatePath(server.url)
        path.trickle(6, every=0.01)  # prompt: the detectors learn every sender's period
        # behind: 5 senders, one batch through every 1.5 s: each sender heard every ~7.5 s, longer
        # than its silence threshold (4 s) on the hub's clock
        path.trickle(16, every=1.5)
        assert len(path.queue) > 40
        path.burst(workers=16)  # the path clears: the backlog, all at once
        wait_until(lambda: not hub.overload.behind(time.time()), 30, "the hub to catch up")
        path.trickle(6, every=0.01)  # prompt again, past every sender's threshold
        alerts = hub.store.alerts(False, 10_000)
        metrics = httpx.get(f"{server.url}/metrics").text
    assert path.acked == path.produced  # everything arrived, late
    assert path.refused > 0  # the burst was more than the hub admits at once
    assert [a.rule for a in alerts if a.rule == HUB_OVERLOADED] == [HUB_OVERLOADED]
    blamed = [f"{a.rule} {a.entity}" for a in alerts if a.rule in {"node_unreachable", "rank_lost"}]
    assert blamed == []
    # the late path did make senders silent on the hub's clock: the verdicts it withheld are counted
    withheld = 'gpuscope_hub_detection_withheld_total{reason="node_verdicts_withheld_watermark"}'
    assert any(line.startswith(withheld) and float(line.split()[-1]) > 0 for line in metrics.splitlines())
