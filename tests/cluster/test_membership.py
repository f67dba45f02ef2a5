"""Membership and shard locks on a real PostgreSQL: every shard owned by exactly one live member,
and a member that dies (its session gone) hands its shards to the survivors."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.membership import ClusterNode
from gpuscope.cluster.schema import NS_SHARD
from support import wait_until

SHARDS = 32


def _cfg(dsn: str, hub: str) -> ClusterConfig:
    return ClusterConfig(dsn, hub, f"http://{hub}.invalid", "peer-token-0123456789", shards=SHARDS, lease_s=1)


@pytest.fixture
def nodes(postgres_dsn: str) -> Iterator[list[ClusterNode]]:
    started = [ClusterNode(_cfg(postgres_dsn, f"hub-{c}")) for c in "abc"]
    for node in started:
        node.join()
    yield started
    for node in started:
        if not node.con.closed:
            node.leave()


def _covered(nodes: list[ClusterNode]) -> bool:
    owned = [node.owned for node in nodes]
    return sum(len(o) for o in owned) == SHARDS and set().union(*owned) == set(range(SHARDS))


def _kill(node: ClusterNode) -> None:
    """What SIGKILL does to a member: its sessions close without a word."""
    node._stop.set()
    node.con.close()
    if node._listen_con is not None:
        node._listen_con.close()


def test_every_shard_has_exactly_one_owner(nodes: list[ClusterNode], postgres_dsn: str) -> None:
    wait_until(lambda: _covered(nodes), 10, "all shards owned once")
    assert all(node.members.keys() == {"hub-a", "hub-b", "hub-c"} for node in nodes)
    assert all(node.owned for node in nodes)
    with psycopg.connect(postgres_dsn, autocommit=True) as con:  # a stranger cannot take one
        row = con.execute("SELECT pg_try_advisory_lock(%s, %s)", (NS_SHARD, 0)).fetchone()
        assert row == (False,)


def test_dead_member_hands_over_without_waiting_for_its_lease(nodes: list[ClusterNode]) -> None:
    wait_until(lambda: _covered(nodes), 10, "all shards owned once")
    victim, survivors = nodes[1], [nodes[0], nodes[2]]
    orphaned = set(victim.owned)
    start = time.monotonic()
    _kill(victim)
    wait_until(lambda: _covered(survivors), 15, "survivors to own every shard")
    handover = time.monotonic() - start
    assert orphaned <= survivors[0].owned | survivors[1].owned
    assert all("hub-b" not in node.members for node in survivors)
    print(f"handover of {len(orphaned)} shards in {handover:.2f} s")


def test_graceful_leave_and_rejoin_rebalance(nodes: list[ClusterNode], postgres_dsn: str) -> None:
    wait_until(lambda: _covered(nodes), 10, "all shards owned once")
    nodes[0].leave()
    wait_until(lambda: _covered(nodes[1:]), 10, "the others to own every shard")
    back = ClusterNode(_cfg(postgres_dsn, "hub-a"))
    back.join()
    try:
        wait_until(lambda: _covered([back, *nodes[1:]]) and bool(back.owned), 10, "rebalanced after rejoin")
    finally:
        back.leave()
