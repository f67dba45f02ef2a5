"""Knocks tell a dead sender from a refused one: a real hub driven past its capacity holds the
silence verdicts of the agents and ranks it refuses (they keep coming back after Retry-After), yet
finds a node and a rank that stopped sending entirely within their usual windows, while it is
still behind, not once the spools have drained."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from detect.rig import FakeCluster, FakeJob
from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.hub import Hub
from gpuscope.ingest.overload import OverloadSettings
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Alert, Batch
from gpuscope.rules import HUB_OVERLOADED
from gpuscope.web.server import HubServer
from support import wait_until
from web.overload_rig import flooding, hub_server

NODES, GPUS = 8, 2  # 24 senders: the two that die are under a tenth of them
FLOODERS = 12
SETTINGS = OverloadSettings(max_in_flight=8, max_lag_s=1.0, retry_after_s=1.0)
#: a 1-s sender's silence threshold (node_unreachable and rank_lost: 4 periods, at least 4 s)
THRESHOLD = 4.0
#: what bounds a dead sender's verdict past its threshold and the settle time: the wire clock may
#: lag by a knock's interval (under 1 s with this fleet), and the alert fires at the evaluation
#: after (1 s); 3 s more for a loaded machine, whose evaluator runs late (the old code found
#: neither while the hub was behind, however long)
BOUND = 5.0
DEAD_NODE, DEAD_RANK = "node-7", 1  # rank 1 runs on node-0: a rank dying on a live node


class _Member(threading.Thread):
    """One agent or one training rank: its own spooling Sender naming what it reports for, posting
    the batches handed to it in order; once killed it sends nothing more, spool and all."""

    def __init__(
        self, url: str, name: str, labels: dict[str, str], tmp: Path, counters: Counters, phase: float
    ) -> None:
        super().__init__(daemon=True, name=name)
        self.phase = phase
        self.sender = Sender(url, spool=Spool(tmp / name, fsync=False), counters=counters, sender=labels)
        self.inbox: queue.Queue[Batch | None] = queue.Queue()
        self.sent = 0

    def run(self) -> None:
        while (batch := self.inbox.get()) is not None:
            time.sleep(self.phase)
            batch.batch_id = f"{self.name}:{self.sent}"
            self.sent += 1
            self.sender.submit(encode_batch(batch))

    def kill(self) -> None:
        self.inbox.put(None)
        self.join(30)


class _Fleet:
    """Eight agents and one job's sixteen ranks, each its own sender, a batch each second."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.cluster = FakeCluster(nodes=NODES, gpus=GPUS)
        self.job = FakeJob.on(self.cluster.names, GPUS, start=time.time())
        self.cluster.allocate(self.job.name, self.job.placement)
        self.counters = Counters()
        senders = [(n, {"node": n}) for n in self.cluster.names] + [
            (f"rank-{rank}", {"job": self.job.name, "rank": str(rank)}) for rank, _, _ in self.job.placement
        ]
        # each sender on its own phase of the second, as agents and ranks started apart are: all 24
        # posting on the same instant would exceed the hub's 8 in flight each tick, so it would shed
        # the fleet's own traffic for ever after the flood and the spools would never drain
        self.members: dict[str, _Member] = {
            name: _Member(url, name, labels, tmp, self.counters, k / len(senders))
            for k, (name, labels) in enumerate(senders)
        }
        self.dead: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        for member in self.members.values():
            member.start()
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(1.0 - time.time() % 1.0):
            t = time.time()
            with self.lock:
                batches = {n: self.cluster.batch(t, n) for n in self.cluster.names}
                job = self.job.batch(t)
                if job is not None:
                    batches.update(_by_rank(job, len(self.job.placement)))
                for name, batch in batches.items():
                    if name not in self.dead:
                        self.members[name].inbox.put(batch)

    def kill(self, name: str) -> None:
        with self.lock:
            self.dead.add(name)
        self.members[name].kill()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for name, member in self.members.items():
            if name not in self.dead:
                member.kill()

    def drained(self) -> bool:
        live = [m for n, m in self.members.items() if n not in self.dead]
        return all(m.inbox.empty() and m.sender.backlog == 0 for m in live)


def _by_rank(batch: Batch, ranks: int) -> dict[str, Batch]:
    """A job's tick as its ranks send it, each in its own batch (the job's start with rank 0)."""
    out: dict[str, Batch] = {}
    for rank in range(ranks):
        events = [e for e in batch.events if e.labels.get("rank", "0") == str(rank)]
        training = [r for r in batch.training if r.rank == rank]
        out[f"rank-{rank}"] = Batch(f"sdk:{batch.source}:{rank}", events=events, training=training)
    return out


@pytest.fixture
def server() -> Iterator[HubServer]:
    with hub_server(SETTINGS) as srv:
        yield srv


def _firing(hub: Hub, rule: str, **entity: str) -> Alert | None:
    for alert in hub.firing():
        if alert.rule == rule and all(alert.entity.get(k) == v for k, v in entity.items()):
            return alert
    return None


def test_a_node_and_a_rank_that_stop_knocking_are_found_while_the_hub_is_behind(
    server: HubServer, tmp_path: Path
) -> None:
    hub = server.hub
    fleet = _Fleet(server.url, tmp_path)
    fleet.start()
    time.sleep(8)  # every sender's period learned, the job stepping; the hub keeps up
    with flooding(server.url, FLOODERS):
        wait_until(lambda: any(a.rule == HUB_OVERLOADED for a in hub.firing()), 20, "hub_overloaded")
        time.sleep(3)
        assert fleet.counters.get("send_failures") > 0  # the fleet is refused too, and spools
        fleet.kill(DEAD_NODE)
        fleet.kill(f"rank-{DEAD_RANK}")
        died = time.time()  # their last request was answered before this
        node = rank = None
        deadline = died + THRESHOLD + SETTINGS.settle + BOUND + 5
        while time.time() < deadline and (node is None or rank is None):
            node = node or _firing(hub, "node_unreachable", node=DEAD_NODE)
            rank = rank or _firing(hub, "rank_lost", job=fleet.job.name, rank=str(DEAD_RANK))
            time.sleep(0.2)
        behind_when_found = hub.overload.behind(time.time())
    try:
        assert node is not None and rank is not None, "a dead node and a dead rank found while behind"
        assert behind_when_found  # found during the overload, not once it ended
        for alert in (node, rank):
            assert died <= alert.started_at <= died + THRESHOLD + SETTINGS.settle + BOUND
        wait_until(fleet.drained, 180, "the live senders' spools to drain")
        time.sleep(8)  # past every live sender's threshold and the settle time after they drained
    finally:
        fleet.close()
    blamed = sorted(
        f"{a.rule} {a.entity.get('node') if a.rule == 'node_unreachable' else a.entity.get('rank')}"
        for a in hub.store.alerts(False, 10_000)
        if a.rule in {"node_unreachable", "rank_lost", "training_stalled"}
        and not a.entity.get("node", "").startswith("flood-")
    )
    assert blamed == [f"node_unreachable {DEAD_NODE}", f"rank_lost {DEAD_RANK}"]
    assert hub.counters.get("silence_verdicts_held_overload") > 0  # the refused live ones were held
