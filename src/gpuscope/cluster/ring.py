"""Which hub owns what: keys map to a fixed set of shards, shards to live members.

A node, job or service name hashes (stably, the same in every process) to one of ``shards``
shards; each shard goes to the member with the highest rendezvous score for it (highest random
weight hashing). Every hub computes the same owners from the same member list without talking,
and a member joining or leaving moves only the shards it wins or held (about 1/N of them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from functools import lru_cache

#: Label keys that place data and alerts, in the order an alert's entity is placed by them: a
#: rank-level alert names job, rank, node and GPU, and belongs with its job.
PLACING_KEYS = ("job", "service", "node")


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=65536)  # every record of every batch is placed: a fleet's names repeat
def shard_of(kind: str, name: str, shards: int) -> int:
    """The shard of one node (``kind="node"``), job or service."""
    return _hash64(f"{kind}\x00{name}") % shards


def entity_shard(entity: Mapping[str, str], shards: int) -> int:
    """The shard that owns an alert on ``entity``: its job, else its service, else its node."""
    for key in PLACING_KEYS:
        if key in entity:
            return shard_of(key, entity[key], shards)
    return _hash64("\x00".join(f"{k}={v}" for k, v in sorted(entity.items()))) % shards


def data_shards(labels: Mapping[str, str], shards: int) -> set[int]:
    """Every shard whose detectors need a record with these labels (its node's, job's, service's)."""
    return {shard_of(key, labels[key], shards) for key in PLACING_KEYS if key in labels}


def owner(shard: int, members: Iterable[str]) -> str | None:
    """The member with the highest rendezvous score for ``shard`` (None without members)."""
    best: tuple[int, str] | None = None
    for member in members:
        score = (_hash64(f"{member}\x00{shard}"), member)
        if best is None or score > best:
            best = score
    return None if best is None else best[1]


def assign(shards: int, members: Iterable[str]) -> dict[int, str]:
    """The owner of every shard for this member list (empty without members)."""
    live = sorted(set(members))
    if not live:
        return {}
    return {s: owner(s, live) or live[0] for s in range(shards)}
