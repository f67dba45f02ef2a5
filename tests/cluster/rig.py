"""Members of a sharded cluster for the tests of this folder: in-process hubs sharing one real
PostgreSQL, each assembled by the runtime from a config file as ``gpuscope hub`` assembles it, and
what SIGKILL does to one. Nothing evaluates or ticks unless the test does it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from alert.sink import Sink
from gpuscope.cluster.member import ClusterMember
from gpuscope.cluster.ring import shard_of
from gpuscope.config import load_config
from gpuscope.runtime import Runtime, assemble
from gpuscope.store.duckdb import DuckDBStore
from support import wait_until

PEER_TOKEN = "peer-token-for-the-test-0123"


def member(
    tmp_path: Path,
    name: str,
    dsn: str,
    shards: int,
    sections: Mapping[str, Any],
    lease_s: float | None = None,
) -> Runtime:
    """Member ``hub-<name>`` with the config's other ``sections`` (receivers, routes, alerting),
    joined to the cluster; its store is in memory."""
    cluster: dict[str, Any] = {"hub_id": f"hub-{name}", "peer_token": PEER_TOKEN, "shards": shards}
    if lease_s is not None:
        cluster["lease_s"] = lease_s
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"cluster": cluster, "state": {"postgres_dsn": dsn}, **sections}))
    runtime = assemble(
        load_config(path), store=DuckDBStore(":memory:", durable=False), serve=False, evaluate_interval=None
    )
    assert runtime.cluster is not None
    runtime.cluster.join()
    return runtime


def cluster_of(runtime: Runtime) -> ClusterMember:
    assert runtime.cluster is not None
    return runtime.cluster


def wait_for_shards(members: Sequence[ClusterMember], shards: int, timeout: float = 15.0) -> None:
    """Until every member owns shards, and every shard has its owner."""
    wait_until(
        lambda: all(m.node.owned for m in members) and sum(len(m.node.owned) for m in members) == shards,
        timeout,
        "every member to own shards",
    )


@contextmanager
def two_members(
    tmp_path: Path,
    dsn: str,
    shards: int,
    sections: Callable[[Sink], Mapping[str, Any]],
    lease_s: float | None = None,
) -> Iterator[tuple[Runtime, Runtime, Sink]]:
    """Members ``a`` and ``b`` with the config sections ``sections(sink)`` gives (receivers on the
    real webhook receiver ``sink``), once they own every shard between them. At the end each stops
    as the runtime stops it: alerting first, then it leaves (a no-op once killed)."""
    sink = Sink()
    runtimes: list[Runtime] = []
    try:
        runtimes += [member(tmp_path, name, dsn, shards, sections(sink), lease_s) for name in "ab"]
        wait_for_shards([cluster_of(r) for r in runtimes], shards)
        yield runtimes[0], runtimes[1], sink
    finally:
        for runtime in runtimes:
            runtime.alerting.stop()
            cluster_of(runtime).leave()
            runtime.hub.store.close()
        sink.down()


def kill(member: ClusterMember) -> None:
    """What SIGKILL does to a member: its sessions close without a word, nothing is handed over,
    nothing more is dispatched or delivered by it."""
    node = member.node
    node._stop.set()
    node.con.close()
    if node._listen_con is not None:
        node._listen_con.close()
    member._joined = False  # its threads and connections are gone with it; leave() must not run
    member.forwarder.stop()
    member.outbox.close()
    member.state.close()


def nodes_of(member: ClusterMember, count: int, shards: int) -> list[str]:
    """The first ``count`` node names whose shard the member owns."""
    owned = member.node.owned
    nodes = [
        n for n in (f"node-{i}" for i in range(100 * count + 100)) if shard_of("node", n, shards) in owned
    ]
    assert len(nodes) >= count
    return nodes[:count]
