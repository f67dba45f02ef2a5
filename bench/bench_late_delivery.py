"""Healthy traffic delivered as an overloaded hub's senders deliver it: how many P1/P2 it raises.

The load generator's fleet (:func:`gpuscope.loadgen.traffic.scenario_doc`, 65 one-GPU nodes: 64
one-rank training jobs and one inference service, no faults; replayed from its 30-tick ring as the load
generator sends it, or ``--sim`` the simulator's own ticks) is fed to the detection engine in
virtual time in the order an overloaded hub takes it, and evaluated every second with its holes
open. The delivery shapes (``--shape``):

* ``backlog`` (the load generator's senders against a shedding hub): each sender's batches wait
  in a spool of 120 (the oldest dropped when full), go out in order a few a second, each request
  refused (503) a third of the time and retried after 1–4 s (the hub's Retry-After, 2 s, up to
  twice that); taken through one of two ingest workers whose backlogs differ by a few seconds
  (so neighbours land out of order); some twice;
* ``spool``: a refused second blocks a sender for 5–130 s (a third of its seconds in all), then
  its spool lands at once, through the two workers, some twice;
* ``scatter``: a third of each sender's batches land 5–130 s late, each on its own, some twice.

Every P1/P2 finding is on a healthy entity: the count is the false pages (the silence verdicts
left out: :mod:`gpuscope.gaps` holds those while the hub sheds).

    python bench/bench_late_delivery.py --minutes 30 --seed 3 --shape backlog
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

from gpuscope.detect.engine import DetectionEngine
from gpuscope.gaps import SILENCE_RULES
from gpuscope.ingest.frame import decode_frame
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, build_scenario, scenario_doc
from gpuscope.model import Batch
from gpuscope.rules import spec
from gpuscope.sim.cluster import Simulator

SHAPES = ("backlog", "spool", "scatter", "on-time")


def traffic(
    shape: FleetShape, seconds: float, faults: list[dict[str, Any]], ring: bool
) -> Iterator[tuple[float, list[Batch]]]:
    """Per second: its time and every sender's batch of it, as the load generator sends them
    (``ring``: its healthy fleet replayed from a 30-tick ring, decoded from the wire) or as the
    simulator makes them."""
    if ring:
        playback = Playback(scenario_doc(shape, seconds, faults))
        for now, out in playback.ticks(0.0):
            yield now, [decode_frame(o.body) for o in out]
        return
    for tick in Simulator(build_scenario(shape, seconds, faults), t0=0.0).ticks():
        yield tick.t, [*tick.node_batches.values(), *tick.sdk_batches]


class Delivery:
    """When each batch reaches the detectors, per the shape (see the module's doc)."""

    def __init__(self, shape: str, rng: random.Random, refused: float = 1 / 3, twice: float = 0.05) -> None:
        self.shape, self.rng, self.refused, self.twice = shape, rng, refused, twice
        self._queue: list[tuple[float, int, Batch]] = []
        self._seq = 0
        self._spools: dict[str, deque[Batch]] = {}
        self._retry: dict[str, float] = {}
        self._lag = [0.0, 0.0]  # each worker's backlog, seconds
        self.offered = self.dropped = self.delivered = 0

    def _land(self, at: float, batch: Batch) -> None:
        copies = 2 if self.rng.random() < self.twice else 1
        for k in range(copies):
            worker = self.rng.randrange(2)
            heapq.heappush(self._queue, (at + self._lag[worker] + 3.0 * k, self._seq, batch))
            self._seq += 1
            self.delivered += 1

    def tick(self, now: float, batches: list[Batch]) -> list[Batch]:
        """Offer this second's batches; return those the detectors take now, in that order."""
        rng = self.rng
        self._lag = [min(5.0, max(0.0, x + rng.gauss(0.0, 0.5))) for x in self._lag]
        for batch in batches:
            self.offered += 1
            if self.shape == "on-time":
                heapq.heappush(self._queue, (now, self._seq, batch))
                self._seq += 1
            elif self.shape == "scatter":
                self._land(now + (rng.uniform(5.0, 130.0) if rng.random() < self.refused else 0.0), batch)
            else:
                spool = self._spools.setdefault(batch.source, deque())
                if len(spool) >= 120:
                    spool.popleft()
                    self.dropped += 1
                spool.append(batch)
        if self.shape == "backlog":
            for source, spool in self._spools.items():
                if now < self._retry.get(source, -1.0):
                    continue
                for _ in range(rng.randint(1, 3)):
                    if not spool:
                        break
                    if rng.random() < self.refused:
                        self._retry[source] = now + rng.uniform(1.0, 4.0)
                        break
                    self._land(now, spool.popleft())
        elif self.shape == "spool":
            for source, spool in self._spools.items():
                until = self._retry.get(source, -1.0)
                if now < until:
                    continue
                if until < now - 1.0 and rng.random() < self.refused / (1.0 - self.refused) / 67.5:
                    self._retry[source] = now + rng.uniform(5.0, 130.0)
                    continue
                while spool:
                    self._land(now, spool.popleft())
        out = []
        while self._queue and self._queue[0][0] <= now:
            out.append(heapq.heappop(self._queue)[2])
        return out


def late_delivery(
    minutes: float,
    seed: int,
    shape: str = "backlog",
    ring: bool = True,
    nodes: int = 65,
    faults: list[dict[str, Any]] | None = None,
) -> tuple[Counter[tuple[str, str]], Delivery, DetectionEngine]:
    """(rule, entity) -> seconds its P1/P2 finding held, over ``minutes`` of the fleet's traffic."""
    # one GPU a node and a job a node: many jobs (and rings) for the CPU of a few nodes
    fleet = FleetShape(nodes=nodes, gpus_per_node=1, job_nodes=1, seed=seed)
    engine = DetectionEngine()
    delivery = Delivery(shape, random.Random(seed))
    held: Counter[tuple[str, str]] = Counter()
    for now, batches in traffic(fleet, minutes * 60.0, faults or [], ring):
        engine.observe_many(delivery.tick(now, batches))
        for f in engine.evaluate(now):
            tier = f.severity or spec(f.rule).tier
            # silence verdicts are the hub's sender gaps' to hold (the overload that made them)
            if tier in ("P1", "P2") and f.rule not in SILENCE_RULES:
                held[(f.rule, ",".join(f"{k}={v}" for k, v in sorted(f.entity.items())))] += 1
    return held, delivery, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--shape", choices=SHAPES, default="backlog")
    parser.add_argument("--nodes", type=int, default=65, help="one a job, one in 128 a service")
    parser.add_argument("--sim", action="store_true", help="the simulator's ticks, not the ring")
    args = parser.parse_args()
    started = time.perf_counter()
    held, delivery, engine = late_delivery(
        args.minutes, args.seed, args.shape, ring=not args.sim, nodes=args.nodes
    )
    for (rule, entity), seconds in sorted(held.items()):
        print(f"{rule:28s} {entity:30s} {seconds:6d} s")
    counters = {k: v for k, v in engine.stats().items() if v and any(w in k for w in ("late", "rollback"))}
    share = delivery.dropped / max(delivery.offered, 1)
    print(
        f"offered {delivery.offered}, dropped {delivery.dropped} ({share:.0%}),"
        f" delivered {delivery.delivered}; {counters}"
    )
    print(f"false P1/P2 entities: {len(held)} ({time.perf_counter() - started:.0f} s wall)")


if __name__ == "__main__":
    main()
