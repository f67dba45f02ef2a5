"""The load generator sends a batch's news (an XID, a lost GPU) ahead of its spool, marked urgent,
as an agent does: a hub that sheds load takes the news first, and nothing is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from gpuscope.agent.sender import Backoff
from gpuscope.ingest.overload import urgent_part
from gpuscope.loadgen.sender import _Worker
from gpuscope.model import Batch, Event, Frame
from load.behind import BehindHub, behind_hub

SHED_FIRST = 2  # requests not marked urgent that the hub refuses before it catches up


@pytest.fixture
def shedding_hub() -> Iterator[BehindHub]:
    """A hub behind on ingest: it sheds plain requests with 503 + Retry-After, takes urgent ones."""
    with behind_hub(lambda urgent, before: not urgent and sum(k.refused for k in before) < SHED_FIRST) as hub:
        yield hub


def test_news_behind_a_spool_reaches_a_shedding_hub_first_and_nothing_is_lost(
    shedding_hub: BehindHub,
) -> None:
    async def run() -> tuple[int, int]:
        worker = _Worker([shedding_hub.url], None, 4, 10.0, 16)
        worker.backoff = Backoff(initial=0.05, jitter=0.0)
        now = time.time()
        worker.enqueue(now, [("node-1", b"frames-%d" % k, 1, 1, 0, 0, False) for k in range(4)])
        worker.enqueue(now + 1, [("node-1", b"xid", 0, 0, 1, 0, True)])
        stats = await worker.finish(grace=10.0)
        return stats.batches_acked, stats.batches_unacked

    acked, unacked = asyncio.run(run())
    assert (acked, unacked) == (5, 0)  # every batch acknowledged once the hub caught up
    assert shedding_hub.taken[0] == b"xid"  # the news went first, past the four batches spooled before it
    assert shedding_hub.taken[1:] == [b"frames-%d" % k for k in range(4)]  # the spool kept its order


def test_a_batch_is_split_into_a_hard_faults_events_and_the_rest_routine_events_staying_in_order() -> None:
    frame = Frame(10.0, ["gpu_utilization_percent"], [{"node": "n", "gpu": "0"}], np.array([[90.0]]))
    xid = Event(10.0, "xid", {"node": "n", "gpu": "0"}, {"code": 79})
    beat = Event(10.0, "heartbeat", {"job": "j", "rank": "0"}, {})
    started = Event(10.0, "job_started", {"job": "j"}, {})
    news, rest = urgent_part(Batch("n", [frame], [xid, beat, started], [], "n:7"))
    assert news is not None and rest is not None
    assert (news.frames, news.events, news.batch_id) == ([], [xid], "n:7:urgent")
    assert (rest.frames, rest.events, rest.batch_id) == ([frame], [beat, started], "n:7")
    routine = Batch("n", [frame], [beat, started], [], "n:8")
    news, rest = urgent_part(routine)
    assert news is None and rest is routine  # no fault: nothing jumps the spool
    only_news = urgent_part(Batch("n", [], [xid], [], "n:9"))
    assert only_news[1] is None and only_news[0] is not None and only_news[0].events == [xid]
