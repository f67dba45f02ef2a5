"""Each agent sends its round at the tick plus an offset of its own: rounds (and their timestamps)
stay on the tick, the fleet's posts do not land on the hub on one instant, and news found while a
spool is pending is not held back for the offset."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np
import pytest

from agent.fakes import FakeClock, FakeHub
from gpuscope.agent.agent import Agent, send_offset
from gpuscope.collect.base import Collected, Collector
from gpuscope.ingest.overload import URGENT_EVENTS, URGENT_HEADER
from gpuscope.model import Event, Frame


@dataclass
class TimedHub(FakeHub):
    """Records when (on the virtual clock) each request arrived and whether it was marked urgent;
    each answer takes 10 ms; while ``shedding`` it answers 503 + Retry-After 2 to every request
    not marked urgent."""

    clock: FakeClock = field(default_factory=FakeClock)
    shedding: bool = False
    posts: list[tuple[float, bool]] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        urgent = request.headers.get(URGENT_HEADER) == URGENT_EVENTS
        self.posts.append((self.clock.t, urgent))
        self.status, self.retry_after = (503, "2") if self.shedding and not urgent else (None, None)
        answer = super().handler(request)
        self.clock.t += 0.01
        return answer


class Gpu(Collector):
    """One GPU; an XID in round ``xid_round``; ``stop`` is set in round ``last``."""

    name: ClassVar[str] = "gpu"

    def __init__(self, node: str, stop: threading.Event, last: int, xid_round: int = 0) -> None:
        super().__init__(node)
        self.stop, self.last, self.xid_round, self.rounds = stop, last, xid_round, 0

    def collect(self, now: float) -> Collected:
        self.rounds += 1
        if self.rounds == self.last:
            self.stop.set()
        frame = Frame(now, ["gpu_utilization_percent"], [{"node": self.node, "gpu": "0"}], np.array([[97.0]]))
        news = (
            [Event(now, "xid", {"node": self.node, "gpu": "0"}, {"code": 79})]
            if self.rounds == self.xid_round
            else []
        )
        return Collected(frames=[frame], events=news)


def _agent(tmp_path: Path, hub: TimedHub, collector: Collector, **kw: float) -> Agent:
    return Agent(
        "http://hub.test",
        "node-3",
        [collector],
        interval=1.0,
        spool_dir=tmp_path / "spool",
        transport=hub.transport,
        clock=hub.clock,
        sleep=hub.clock.sleep,
        fsync=False,
        **kw,  # type: ignore[arg-type]
    )


def test_offsets_are_the_nodes_own_stable_and_spread_over_the_fleet(tmp_path: Path) -> None:
    fleet = [send_offset(f"gpu-node-{k:04d}", 0.5) for k in range(1024)]
    assert all(0 <= x < 0.5 for x in fleet)
    assert len(set(fleet)) == len(fleet)  # no two nodes share a slot
    # even over the spread: each twentieth of it holds about 1/20 of the fleet (51), none twice that
    per_slot = Counter(int(x / 0.025) for x in fleet)
    assert len(per_slot) == 20 and max(per_slot.values()) < 2 * 1024 / 20
    # the same node, another start (a new agent, a new process): the same offset
    hub = TimedHub()
    for spool in ("a", "b"):
        agent = Agent("http://hub.test", "node-3", [], spool_dir=tmp_path / spool, fsync=False)
        assert agent.send_offset == send_offset("node-3", 0.5) != send_offset("node-4", 0.5)
        agent.close()
    off = _agent(tmp_path, hub, Gpu("node-3", threading.Event(), 0), send_spread=0.0)
    assert off.send_offset == 0.0
    off.close()
    with pytest.raises(
        ValueError, match=r"^--send-spread must be from 0 to below 0\.8 x --interval \(0\.8 s\), got 0\.8$"
    ):
        _agent(tmp_path, hub, Gpu("node-3", threading.Event(), 0), send_spread=0.8)


@pytest.mark.parametrize("spread", [None, 0.0])
def test_a_round_is_stamped_on_its_tick_and_sent_at_the_nodes_offset(
    tmp_path: Path, spread: float | None
) -> None:
    hub, stop = TimedHub(), threading.Event()
    hub.clock.t = 1000.3
    kw = {} if spread is None else {"send_spread": spread}
    agent = _agent(tmp_path, hub, Gpu("node-3", stop, last=4), **kw)
    offset = agent.send_offset
    assert (offset > 0) == (spread is None)
    agent.run(stop)
    assert [f.ts for b in hub.stored for f in b.frames] == [1001.0, 1002.0, 1003.0, 1004.0]
    # rounds 1-3 at their ticks plus the offset; round 4 was collected as the agent was stopped:
    # sent at once
    assert [t for t, _ in hub.posts] == [1001.0 + offset, 1002.0 + offset, 1003.0 + offset, 1004.0]
    agent.close()


def test_news_behind_a_spool_goes_at_the_tick_and_the_rest_in_the_nodes_slot(tmp_path: Path) -> None:
    """The hub sheds the agent's frames (Retry-After 2); the XID of round 3 is posted at its tick,
    ahead of the spool, while the frames are tried only in the node's slot: a fleet the hub shed
    comes back spread as it sends, not all on one later tick."""
    hub, stop = TimedHub(shedding=True), threading.Event()
    hub.clock.t = 1000.3
    agent = _agent(tmp_path, hub, Gpu("node-3", stop, last=8, xid_round=3))
    offset = agent.send_offset
    agent.run(stop)
    assert [t for t, marked in hub.posts if marked] == [1003.0]
    assert [e.kind for b in hub.stored for e in b.events] == ["xid"]
    # round 1 refused in its slot, so waiting past round 3's; the XID's answer ended that wait
    # (the hub took a request), so round 3's slot tried again, refused: next in round 6's slot.
    # Round 8, collected as the agent stopped, would go at once but the hub's 2 s are not over
    tried = [t for t, marked in hub.posts if not marked]
    assert tried == pytest.approx([1001.0 + offset, 1003.0 + offset, 1006.0 + offset])
    assert len(agent.sender.spool) == 8
    agent.close()
