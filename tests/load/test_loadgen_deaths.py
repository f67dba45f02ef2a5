"""The load generator's senders knock as real ones do: a refused stream comes back after the hub's
Retry-After (not after an escalated backoff that would keep it away past its silence threshold),
and a sender a fault kills stops knocking at once, its queue dying with it; the rank a
``rank_dropout`` kills is a stream of its own that names it, as a real rank's SDK does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import pairwise

import pytest

from gpuscope.agent.sender import Backoff
from gpuscope.ingest.frame import decode_frame
from gpuscope.ingest.overload import SENDER_HEADER, parse_sender
from gpuscope.loadgen.playback import Playback, rank_stream
from gpuscope.loadgen.sender import _Worker, sender_line
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from load.behind import BehindHub, behind_hub

T0 = 1_800_000_000.0
REFUSE_FIRST = 4


@pytest.fixture
def refusing_hub() -> Iterator[BehindHub]:
    """A hub behind on ingest: it refuses the first requests with 503 + Retry-After: 1."""
    with behind_hub(lambda urgent, before: len(before) < REFUSE_FIRST) as hub:
        yield hub


def test_a_refused_stream_comes_back_after_the_hubs_retry_after_not_an_escalated_backoff(
    refusing_hub: BehindHub,
) -> None:
    async def run() -> int:
        worker = _Worker([refusing_hub.url], None, 2, 10.0, 16)
        worker.backoff = Backoff(initial=0.05, factor=10.0, cap=10.0, jitter=0.0)  # escalates to 10 s
        worker.enqueue(time.time(), [("node-1", b"frames", 1, 1, 0, 0, False)])
        stats = await worker.finish(grace=20.0)
        return stats.batches_acked

    assert asyncio.run(run()) == 1
    gaps = [b.arrival - a.arrival for a, b in pairwise(refusing_hub.knocks)]
    assert len(gaps) == REFUSE_FIRST and all(0.9 <= g < 3.0 for g in gaps)  # 1 s each, as asked


def test_a_sender_a_fault_kills_stops_knocking_and_its_queue_dies_with_it(refusing_hub: BehindHub) -> None:
    async def run() -> tuple[int, int, int]:
        worker = _Worker([refusing_hub.url], None, 2, 10.0, 16)
        now = time.time()
        worker.enqueue(now, [("node-1", b"frames-%d" % k, 1, 1, 0, 0, False) for k in range(3)])
        worker.enqueue(now, [("node-2", b"frames", 1, 1, 0, 0, False)])
        await asyncio.sleep(0.3)  # both refused once: node-1 waits for its Retry-After, spooled
        worker.kill(["node-1"])
        worker.enqueue(now + 1, [("node-1", b"frames-3", 1, 1, 0, 0, False)])  # a dead node sends nothing
        stats = await worker.finish(grace=10.0)
        return stats.batches_died, stats.batches_acked, stats.batches_unacked

    died, acked, unacked = asyncio.run(run())
    assert (died, acked, unacked) == (4, 1, 0)  # node-2's batch got through; node-1's died with it
    senders = [k.sender for k in refusing_hub.knocks]
    assert senders.count("node=node-1") == 1  # its one refused request, then nothing


def test_the_rank_a_dropout_kills_is_a_stream_of_its_own_and_a_down_node_is_named_to_die() -> None:
    shape = FleetShape(nodes=40, gpus_per_node=2, job_nodes=4)
    faults = [
        {"at": 6, "kind": "rank_dropout", "target": {"job": "job-2", "rank": 3}},
        {"at": 7, "kind": "node_down", "target": {"node": "node-30"}},
    ]
    playback = Playback(scenario_doc(shape, 12, faults), ring=5, warmup=12)
    stream = rank_stream("job-2", 3)
    assert playback.deaths == {stream: 6.0, "node-30": 7.0}
    name, _, value = sender_line(stream).decode().rstrip("\r\n").partition(": ")
    assert name == SENDER_HEADER and parse_sender(value) == (("job", "job-2"), ("rank", "3"))
    sent: list[int] = []
    for k, (_, out) in enumerate(playback.ticks(T0)):
        for o in out:
            batch = decode_frame(o.body)
            ranks = {e.labels.get("rank") for e in batch.events} | {str(t.rank) for t in batch.training}
            if o.sender == stream:
                sent.append(k)
                assert ranks == {"3"} and not batch.frames  # that rank's heartbeats and steps only
            elif o.sender == "sdk:job-2":
                assert "3" not in ranks  # the job's stream carries its other ranks
    assert sent and max(sent) < 6  # heartbeating until the fault, then silent
