"""Shard takeover warms the new owner's detectors up from its own store (issue 9): when the hub
owning a silent node dies, the survivor still raises node_unreachable for it (once, continuing the
dead hub's alert when that had already fired), and no node that kept reporting is blamed for the
handover.

Two in-process members share a real PostgreSQL. Every batch lands in both stores, as round-robin
agents leave it: the owner of the node's shard ingests it (its detectors see it), the other hub
stores it without detecting, as it would before forwarding the part to the owner."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import pytest

from cluster.rig import kill, wait_for_shards
from detect.rig import FakeCluster
from gpuscope.alert.engine import AlertChange
from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.member import ClusterMember
from gpuscope.cluster.ring import shard_of
from gpuscope.counters import Counters
from gpuscope.model import Batch
from gpuscope.rules import HUB_OVERLOADED
from gpuscope.runtime import member_hub
from gpuscope.store.duckdb import DuckDBStore
from support import wait_until

SHARDS = 16
RULE = "node_unreachable"
SILENT_AT = 30  # the tick from which the silent node sends nothing


def _member(dsn: str, name: str) -> ClusterMember:
    cfg = ClusterConfig(
        dsn, f"hub-{name}", f"http://hub-{name}.invalid", "peer-token-0123456789", SHARDS, 1.0
    )
    member = ClusterMember(cfg, Counters())
    member_hub(DuckDBStore(":memory:", durable=False), member)
    member.join()
    return member


@pytest.fixture
def pair(postgres_dsn: str) -> Iterator[tuple[ClusterMember, ClusterMember]]:
    hubs = [_member(postgres_dsn, name) for name in "ab"]
    try:
        wait_for_shards(hubs, SHARDS, 10)
        yield hubs[0], hubs[1]
    finally:
        for hub in hubs:
            hub.leave()  # a no-op for a killed member
            hub.hub.store.close()


class Agents:
    """Nodes reporting once a tick; each batch is stored by both hubs and detected by its owner."""

    def __init__(self, a: ClusterMember, b: ClusterMember) -> None:
        owned_a = [n for n in (f"node-{i}" for i in range(64)) if self._shard(n) in a.node.owned]
        owned_b = [n for n in (f"node-{i}" for i in range(64)) if self._shard(n) in b.node.owned]
        self.silent, self.steady = owned_a[:2]  # both on hub a: one goes quiet, one keeps on
        self.others = owned_b[:2]
        self.fleet = FakeCluster(nodes=64, gpus=1)
        self.names = [self.silent, self.steady, *self.others]
        self.hubs = [a, b]
        #: ticks in which a node's batches are stuck in its sender (moving from a dead hub)
        self.moving: dict[str, range] = {}
        #: the tick from which a node sends nothing more (it died)
        self.gone: dict[str, int] = {}
        #: while set, the hubs are behind: their event loops run this late, and the requests
        #: ``refused(node, tick)`` selects are shed with Retry-After (the sender names its node)
        self.lag = 0.0
        self.refused: Callable[[str, int], bool] = lambda node, tick: False

    @staticmethod
    def _shard(node: str) -> int:
        return shard_of("node", node, SHARDS)

    def _deliver(self, batch: Batch, node: str) -> None:
        for hub in self.hubs:
            if self._shard(node) in hub.node.owned:
                hub.hub.ingest(batch)
            else:
                hub.hub.store.append(batch)

    def run(self, t0: float, start: int, stop: int) -> dict[str, list[tuple[float, AlertChange]]]:
        """Ticks ``start..stop-1`` (virtual time ``t0 + tick``): report, then every live hub evaluates."""
        changes: dict[str, list[tuple[float, AlertChange]]] = {h.cfg.hub_id: [] for h in self.hubs}
        for tick in range(start, stop):
            now = t0 + tick
            for hub in self.hubs:
                hub.hub.overload.loop_lag(now, self.lag)
            for node in self.names:
                if (node == self.silent and tick >= SILENT_AT) or tick >= self.gone.get(node, stop):
                    continue
                if tick in self.moving.get(node, ()):
                    continue
                if self.lag and self.refused(node, tick):
                    for hub in self.hubs:
                        if self._shard(node) in hub.node.owned:
                            assert hub.hub.overload.admit(now, (("node", node),)).ticket is None
                    continue
                self._deliver(self.fleet.batch(now, node), node)
            for hub in self.hubs:
                changes[hub.cfg.hub_id].extend((now, c) for c in hub.hub.evaluate(now))
        return changes


def _owns_all(hub: ClusterMember) -> bool:
    with hub.node.lock:  # held while shards are taken, until their warm-up is done
        return hub.node.owned == set(range(SHARDS))


def _of(changes: list[tuple[float, AlertChange]], node: str, kind: str) -> list[tuple[float, AlertChange]]:
    return [
        (t, c)
        for t, c in changes
        if c.alert.rule == RULE and c.alert.entity["node"] == node and c.kind == kind
    ]


def _kill_and_take_over(pair: tuple[ClusterMember, ClusterMember]) -> tuple[Agents, int, int]:
    """Agents report to both hubs until hub a is SIGKILLed, then to hub b once it owns every shard."""
    a, b = pair
    agents = Agents(a, b)
    t0 = math.floor(time.time()) - 40
    died_at = SILENT_AT + 2
    agents.run(t0, 0, died_at)
    kill(a)
    agents.hubs = [b]
    wait_until(lambda: _owns_all(b), 10, "hub b to take every shard")
    return agents, t0, died_at


@pytest.mark.parametrize("fired_first", [False, True], ids=["dies-before-firing", "dies-after-firing"])
def test_survivor_raises_node_unreachable_for_the_dead_hubs_silent_node_once(
    pair: tuple[ClusterMember, ClusterMember], fired_first: bool
) -> None:
    a, b = pair
    agents = Agents(a, b)
    t0 = math.floor(time.time()) - 40  # the takeover warm-up reads the last minutes before the wall clock
    died_at = SILENT_AT + (8 if fired_first else 2)
    before = agents.run(t0, 0, died_at)
    fired_on_a = _of(before["hub-a"], agents.silent, "fired")
    assert len(fired_on_a) == (1 if fired_first else 0)
    assert not [
        c for changes in before.values() for _, c in changes if c.alert.entity["node"] != agents.silent
    ]

    orphaned = set(a.node.owned)
    kill(a)
    agents.hubs = [b]  # the agents move on to the hub that answers
    wait_until(lambda: _owns_all(b), 10, "hub b to take every shard")
    assert b.counters.get("warmup_batches") > 0 and orphaned <= b.node.owned

    held_until = b.hub.gaps.until({"node": agents.silent}, t0 + died_at)
    assert held_until is not None  # the silent node's shard moved: its verdict waits for its sender
    after = agents.run(t0, died_at, died_at + 20)["hub-b"]
    fired_on_b = _of(after, agents.silent, "fired")
    firing = [x for x in b.hub.firing() if x.rule == RULE]
    assert [x.entity["node"] for x in firing] == [agents.silent]  # nobody else blamed for the handover
    assert not _of(after, agents.silent, "resolved")
    if fired_first:
        assert not fired_on_b  # continued, not fired (nor notified) again
        assert firing[0].id == fired_on_a[0][1].alert.id
        # continued at least once; a lease renewal that fails during the handover can make b
        # release and retake a shard, continuing the same alert again (never firing it again)
        assert b.counters.get("cluster_alerts_adopted") >= 1
    else:
        (fired,) = fired_on_b
        # within the detector's budget (4 x the 1 s period) of its last report, or at the end of
        # the hold on the moved shard's silence verdicts (the senders' failover grace)
        assert fired[0] <= max(t0 + SILENT_AT + 5, held_until + 1)
    assert not [c for _, c in after if c.alert.entity["node"] != agents.silent]


def test_nodes_whose_senders_move_during_the_takeover_are_not_blamed_and_a_dead_one_still_is(
    pair: tuple[ClusterMember, ClusterMember],
) -> None:
    """The senders of the dead hub's nodes need a few seconds to find the survivor (their next
    send, a refused connection, a reroute): longer than node_unreachable's 4 s threshold, within
    the survivor's failover grace. Only the node that really went quiet is alerted, at the end of
    the hold at the latest."""
    agents, t0, died_at = _kill_and_take_over(pair)
    b = pair[1]
    grace = b.failover_grace
    assert 4 < grace <= 2 * b.cfg.renew_s + 5  # wider than the threshold, bounded
    held_until = b.hub.gaps.until({"node": agents.steady}, t0 + died_at)
    assert held_until is not None
    # the steady node's sender is silent for 6 s after the kill: longer than the threshold
    moving = math.ceil(held_until - t0) - 1 - died_at
    assert moving >= 5
    agents.moving[agents.steady] = range(died_at, died_at + moving)
    after = agents.run(t0, died_at, died_at + moving + 10)["hub-b"]
    assert not _of(after, agents.steady, "fired")  # the cluster's gap, not the node's
    assert b.counters.get("silence_verdicts_held_takeover") > 0
    (fired,) = _of(after, agents.silent, "fired")  # the node that is really gone
    assert held_until <= fired[0] <= held_until + 1


def test_a_node_that_dies_while_the_survivor_is_behind_is_alerted_within_its_threshold_and_the_delay(
    pair: tuple[ClusterMember, ClusterMember],
) -> None:
    """Run (c) of docs/scaling.md: after the takeover the survivor is behind on its own ingest for
    the rest of the run (its event loop late, every node's requests refused in turns, the senders
    naming their node). A node that dies after the takeover's hold is alerted within its threshold
    (4 x its 1 s period) plus the hub's delay of its last report, or of the end of the gap its last
    refusal made, while the hub is still behind: not when the hub has caught up. The node that died
    with the killed hub is alerted at the end of the hold, and no node the hub refused is blamed."""
    agents, t0, died_at = _kill_and_take_over(pair)
    b = pair[1]
    held_until = b.hub.gaps.until({"node": agents.steady}, t0 + died_at)
    assert held_until is not None
    hold_end = math.ceil(held_until - t0)  # the first tick after the hold
    victim = agents.steady  # moved from the dead hub: b owns it now
    agents.gone[victim] = hold_end + 5
    lag = 3.0
    agents.lag = lag
    agents.refused = lambda node, tick: (tick + agents.names.index(node)) % 3 != 0  # two sends in three
    after = agents.run(t0, died_at, hold_end + 20)["hub-b"]

    (fired,) = _of(after, victim, "fired")
    # due at its threshold plus the hub's delay after the later of: its last report, and the end
    # of the gap the hub made it by its last refusal (the settle time after; silence from then: its
    # spooled reports queue on the way back like everyone's)
    last_report = t0 + agents.gone[victim] - 1
    last_refused = t0 + max(t for t in range(died_at, agents.gone[victim]) if agents.refused(victim, t))
    due = max(last_report, last_refused + b.hub.overload.settings.settle) + lag + 4
    assert last_report + 4 <= fired[0] <= due + 1
    assert any(x.rule == HUB_OVERLOADED for x in b.hub.firing())  # still behind when it was alerted
    (gone,) = _of(after, agents.silent, "fired")
    assert held_until <= gone[0] <= held_until + 1
    blamed = {c.alert.entity["node"] for _, c in after if c.alert.rule == RULE}
    assert blamed == {victim, agents.silent}
    assert b.counters.get("silence_verdicts_held_overload") > 0
