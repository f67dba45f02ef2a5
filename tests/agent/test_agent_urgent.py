"""An agent behind a hub that sheds load sends an XID ahead of its spool, marked urgent: the hub
has the fault while the frames still wait, and afterwards every round is stored once, in order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np

from agent.fakes import FakeClock, FakeHub
from gpuscope.agent.agent import Agent
from gpuscope.collect.base import Collected, Collector
from gpuscope.ingest.overload import URGENT_EVENTS, URGENT_HEADER
from gpuscope.model import Event, Frame

XID_ROUND = 5


@dataclass
class SheddingHub(FakeHub):
    """Behind on ingest while ``shedding``: 503 + Retry-After to every request not marked urgent."""

    shedding: bool = False

    def handler(self, request: httpx.Request) -> httpx.Response:
        urgent = request.headers.get(URGENT_HEADER) == URGENT_EVENTS
        self.status, self.retry_after = (503, "2") if self.shedding and not urgent else (None, None)
        return super().handler(request)


class Gpu(Collector):
    """One GPU; an XID in round ``XID_ROUND``."""

    name: ClassVar[str] = "gpu"

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.rounds = 0

    def collect(self, now: float) -> Collected:
        self.rounds += 1
        frame = Frame(now, ["gpu_utilization_percent"], [{"node": self.node, "gpu": "0"}], np.array([[97.0]]))
        xid = (
            [Event(now, "xid", {"node": self.node, "gpu": "0"}, {"code": 79})]
            if self.rounds == XID_ROUND
            else []
        )
        return Collected(frames=[frame], events=xid)


def test_an_xid_jumps_the_spool_of_a_shed_agent_and_nothing_is_lost_or_doubled(tmp_path: Path) -> None:
    hub, clock = SheddingHub(), FakeClock()
    agent = Agent(
        "http://hub.test",
        "node-3",
        [Gpu("node-3")],
        interval=1.0,
        spool_dir=tmp_path / "spool",
        transport=hub.transport,
        clock=clock,
        sleep=clock.sleep,
        fsync=False,
    )
    xid_stored_at = None
    for k in range(1, 21):
        hub.shedding = 2 <= k <= 12  # the hub sheds from round 2 to 12
        agent.step()
        if xid_stored_at is None and any(e.kind == "xid" for b in hub.stored for e in b.events):
            xid_stored_at = k
        clock.sleep(1.0)
    agent.sender.flush()
    assert xid_stored_at == XID_ROUND  # stored in its own round, while the hub shed the frames
    assert agent.stats()["batches_urgent"] == 1
    xids = [e for b in hub.stored for e in b.events if e.kind == "xid"]
    assert len(xids) == 1 and xids[0].labels == {"node": "node-3", "gpu": "0"}
    rounds = [f.ts for b in hub.stored for f in b.frames]
    assert rounds == sorted(rounds) and len(rounds) == len(set(rounds)) == 20  # every round once, in order
    assert len(agent.sender.spool) == 0
    agent.close()
