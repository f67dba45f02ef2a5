"""An agent behind a hub that sheds load sends an XID ahead of its spool, marked urgent: the hub
has the fault while the frames still wait, and afterwards every round is stored once, in order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np
import pytest

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


class AgentKilled(BaseException):
    """The agent's process dies where this is raised: nothing after it runs."""


@dataclass
class DyingHub(SheddingHub):
    """Kills the agent during its next urgent send: ``"before"`` the hub had the batch, or
    ``"after"`` it stored it (the answer never reaches the agent)."""

    die: str | None = None

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get(URGENT_HEADER) == URGENT_EVENTS and self.die is not None:
            when, self.die = self.die, None
            if when == "after":
                super().handler(request)
            raise AgentKilled
        return super().handler(request)


def _agent(hub: FakeHub, clock: FakeClock, spool: Path) -> Agent:
    return Agent(
        "http://hub.test",
        "node-3",
        [Gpu("node-3")],
        interval=1.0,
        spool_dir=spool,
        transport=hub.transport,
        clock=clock,
        sleep=clock.sleep,
        fsync=False,
    )


@pytest.mark.parametrize("when", ["before", "after"])
def test_news_sent_ahead_is_written_first_and_survives_the_agent_dying_during_its_send(
    tmp_path: Path, when: str
) -> None:
    """The hub sheds the agent's frames; in the XID's round the agent dies while posting it
    ahead, before the hub had it or after it stored it. The restarted agent replays it from the
    disk first; the hub has it exactly once."""
    hub, clock = DyingHub(), FakeClock()
    agent = _agent(hub, clock, tmp_path / "spool")
    for k in range(1, XID_ROUND + 1):
        hub.shedding = k >= 2
        hub.die = when if k == XID_ROUND else None
        try:
            agent.step()
        except AgentKilled:
            assert k == XID_ROUND
            break
        clock.sleep(1.0)
    agent.close()  # what the dead process held is released; nothing more was sent or acknowledged
    hub.shedding = False
    again = _agent(hub, clock, tmp_path / "spool")
    again.sender.flush()
    xids = [b.batch_id for b in hub.stored if any(e.kind == "xid" for e in b.events)]
    assert len(xids) == 1 and xids[0] is not None and xids[0].endswith(":urgent")
    assert hub.seen_ids.count(xids[0]) == (2 if when == "after" else 1)  # resent: the hub kept one
    rounds = [f.ts for b in hub.stored for f in b.frames]
    assert len(rounds) == len(set(rounds)) == XID_ROUND - 1  # the frames spooled before: once each
    assert again.sender.backlog == 0
    again.close()
