"""A cluster member's :class:`~gpuscope.placement.Placement`: each part of a batch is detected by
the hub that owns its shard. Parts this hub owns go to its own detectors; the others are
forwarded to their owners (:mod:`.forward`), which route them again by what they own then.

Forwarding is the exception: every ingest answer names the hub that owns the sender's shard
(:meth:`ShardPlacement.owner_url`), and agents and SDKs send their next batches there. What is
still forwarded is counted per received batch (``cluster_batches_forwarded`` against
``cluster_batches_local``): batches of senders that have not followed yet, and the rows a batch
carries for another shard (an agent's GPU rows labelled with a job whose shard a peer owns).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager

from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.forward import Forwarder
from gpuscope.cluster.membership import ClusterNode
from gpuscope.cluster.ring import data_shards, entity_shard, shard_of
from gpuscope.cluster.route import split
from gpuscope.counters import Counters
from gpuscope.detect.settings import WARMUP_S
from gpuscope.model import Batch, Labels
from gpuscope.placement import Observe, WarmUp

LOCAL = ""
#: how many times a part may be passed on between hubs while ownership moves
MAX_HOPS = 2


class ShardPlacement:
    def __init__(self, node: ClusterNode, counters: Counters) -> None:
        self.node = node
        self.cfg: ClusterConfig = node.cfg
        self.counters = counters
        #: set by the member: where parts owned by peers go
        self.forwarder: Forwarder | None = None
        #: seconds of stored history replayed to the detectors for the shards this hub takes
        self.warmup_s = WARMUP_S

    def owns(self, entity: Labels) -> bool:
        return entity_shard(entity, self.cfg.shards) in self.node.owned

    def held(self) -> AbstractContextManager[object]:
        return self.node.lock

    def resume(self, now: float, window: float, warm_up: WarmUp) -> None:
        """Detectors warm up shard by shard, as this hub takes them (see the member)."""
        self.warmup_s = window

    def observe(self, batch: Batch, local: Observe) -> None:
        self.route(batch, 0, local)

    def route(self, batch: Batch, hops: int, local: Observe) -> dict[str, int]:
        """Observe this hub's parts of ``batch``, forward the others to their owners."""
        parts = split(batch, lambda labels: self._destinations(labels, batch.source))
        counts: dict[str, int] = {"observed": 0, "forwarded": 0}
        for dest, part in parts.items():
            if dest == LOCAL or hops >= MAX_HOPS or self.forwarder is None:
                if dest != LOCAL:
                    self.counters.inc("cluster_forward_hops_exceeded")
                local(part)
                counts["observed"] += 1
            else:
                self.forwarder.send(dest, part, hops + 1)
                counts["forwarded"] += 1
        if hops == 0:  # a batch from its sender (not a part a peer passed on)
            self.counters.inc("cluster_batches_forwarded" if counts["forwarded"] else "cluster_batches_local")
        return counts

    def owner_url(self, batch: Batch) -> str | None:
        """The URL of the hub that should receive this sender's batches: the one whose detectors
        need every record of the batch (an agent's node, an SDK's job), else the one needing most."""
        records = list(_record_labels(batch)) or [{}]
        tally: Counter[str] = Counter()
        for labels in records:
            tally.update(self._hubs(labels, batch.source))
        total = len(records)
        hub = max(tally.items(), key=lambda item: (item[1] == total, item[1], item[0]))[0]
        if hub == self.cfg.hub_id:
            return self.cfg.advertise_url
        return self.node.members.get(hub)

    def _hubs(self, labels: Labels, source: str) -> set[str]:
        """The hubs (ids) whose detectors need a record with these labels."""
        shards = data_shards(labels, self.cfg.shards) or {shard_of("source", source, self.cfg.shards)}
        assignment = self.node.assignment
        return {assignment.get(shard, self.cfg.hub_id) for shard in shards}

    def _destinations(self, labels: Labels, source: str) -> set[str]:
        return {LOCAL if hub == self.cfg.hub_id else hub for hub in self._hubs(labels, source)}


def _record_labels(batch: Batch) -> Iterator[Labels]:
    """The labels of every record of a batch, as :func:`~.route.split` places them."""
    for frame in batch.frames:
        yield from frame.entities
    for event in batch.events:
        yield event.labels
    for record in batch.training:
        yield {**record.labels, "job": record.job}
