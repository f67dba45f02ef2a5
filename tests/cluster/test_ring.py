"""Shard placement: stable, balanced, and moving only what must move when members change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from gpuscope.cluster.config import ClusterConfigError, parse_cluster
from gpuscope.cluster.ring import assign, data_shards, entity_shard, shard_of
from gpuscope.cluster.route import split
from gpuscope.config import ConfigError, load_config
from gpuscope.model import Batch, Event, Frame, TrainingRecord

SHARDS = 256


def test_balance_over_three_members() -> None:
    owners = assign(SHARDS, ["hub-a", "hub-b", "hub-c"])
    counts = {hub: sum(1 for o in owners.values() if o == hub) for hub in ("hub-a", "hub-b", "hub-c")}
    assert sum(counts.values()) == SHARDS
    assert all(55 <= n <= 115 for n in counts.values()), counts  # ideal 85; rendezvous spread


def test_leave_moves_only_the_leavers_shards() -> None:
    before = assign(SHARDS, ["hub-a", "hub-b", "hub-c"])
    after = assign(SHARDS, ["hub-a", "hub-c"])
    moved = {s for s in range(SHARDS) if before[s] != after[s]}
    assert moved == {s for s, hub in before.items() if hub == "hub-b"}


def test_join_takes_shards_only_for_the_newcomer() -> None:
    before = assign(SHARDS, ["hub-a", "hub-b"])
    after = assign(SHARDS, ["hub-a", "hub-b", "hub-c"])
    moved = {s for s in range(SHARDS) if before[s] != after[s]}
    assert moved and all(after[s] == "hub-c" for s in moved)
    assert len(moved) < SHARDS / 2


def test_placement_is_stable_and_follows_the_entity() -> None:
    assert shard_of("node", "node-3", SHARDS) == shard_of("node", "node-3", SHARDS)
    assert assign(SHARDS, ["b", "a"]) == assign(SHARDS, ["a", "b"])
    rank_alert = {"job": "llm", "rank": "5", "node": "node-1", "gpu": "5"}
    assert entity_shard(rank_alert, SHARDS) == shard_of("job", "llm", SHARDS)
    assert entity_shard({"node": "node-1", "gpu": "3"}, SHARDS) == shard_of("node", "node-1", SHARDS)
    assert data_shards({"node": "n", "job": "j", "gpu": "0"}, SHARDS) == {
        shard_of("node", "n", SHARDS),
        shard_of("job", "j", SHARDS),
    }
    assert assign(SHARDS, []) == {}


def test_split_sends_each_record_to_each_destination_once() -> None:
    entities = [{"node": "n0", "gpu": "0"}, {"node": "n1", "gpu": "0", "job": "j"}]
    frame = Frame(1.0, ["m"], entities, np.array([[1.0], [2.0]]))
    batch = Batch(
        "agent",
        frames=[frame],
        events=[Event(1.0, "xid", {"node": "n1", "gpu": "0"})],
        training=[TrainingRecord(1.0, "j", 0, 1, {"loss": 1.0})],
    )
    where = {"n0": {"A"}, "n1": {"B"}, "j": {"B"}}

    def place(labels: dict[str, str]) -> set[str]:
        return set().union(*(where[v] for k, v in labels.items() if k in {"node", "job"}))

    parts = split(batch, place)
    assert sorted(parts) == ["A", "B"]
    assert parts["A"].frames[0].entities == [entities[0]]
    assert parts["B"].frames[0].values.tolist() == [[2.0]]  # n1 and j both on B: the row once
    assert len(parts["B"].events) == 1 and len(parts["B"].training) == 1
    assert not parts["A"].events and not parts["A"].training


def test_cluster_section_is_checked_naming_the_key(tmp_path: Path) -> None:
    ok = {"postgres_dsn": "postgresql://h/db", "peer_token": "x" * 16}
    cfg = parse_cluster({"cluster": ok}, "127.0.0.1", 7470)
    assert cfg is not None and cfg.advertise_url == "http://127.0.0.1:7470" and cfg.shards == 256
    assert parse_cluster({}, "127.0.0.1", 7470) is None
    for bad, key in [
        ({**ok, "shards": 0}, "cluster.shards"),
        ({**ok, "peer_token": "short"}, "cluster.peer_token"),
        ({"peer_token": "x" * 16}, "cluster.postgres_dsn"),
        ({**ok, "lease_s": "5"}, "cluster.lease_s"),
        ({**ok, "advertise_url": "10.0.0.1:7470"}, "cluster.advertise_url"),
        ({**ok, "sharts": 4}, "cluster.sharts"),
    ]:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"cluster": bad}))
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(path)


def test_state_postgres_dsn_is_the_cluster_database() -> None:
    token = {"peer_token": "x" * 16}
    dsn = "postgresql://db/gpuscope"
    cfg = parse_cluster({"state": {"postgres_dsn": dsn}, "cluster": token}, "127.0.0.1", 7470)
    assert cfg is not None and cfg.postgres_dsn == dsn
    same = parse_cluster({"state": {"postgres_dsn": dsn}, "cluster": {**token, "postgres_dsn": dsn}}, "h", 1)
    assert same is not None and same.postgres_dsn == dsn
    for raw, field in [
        (
            {"state": {"postgres_dsn": dsn}, "cluster": {**token, "postgres_dsn": dsn + "2"}},
            "cluster.postgres_dsn",
        ),
        ({"state": {"postgres_dsn": dsn}}, "cluster.peer_token"),
        ({"state": {"dsn": dsn}}, "state.dsn"),
        ({"state": "x"}, "state"),
    ]:
        with pytest.raises(ClusterConfigError, match=f"^{field}:"):
            parse_cluster(raw, "127.0.0.1", 7470)


def test_peer_token_may_ingest_and_nothing_more_when_auth_is_on(tmp_path: Path) -> None:
    peer = "p" * 20
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "auth": {"tokens": [{"name": "ops", "scopes": ["admin", "read"], "token": "o" * 20}]},
                "cluster": {"postgres_dsn": "postgresql://h/db", "peer_token": peer},
            }
        )
    )
    found = load_config(path).auth.match(peer)
    assert found is not None and found.name == "cluster-peer" and found.scopes == {"ingest"}
