"""The load generator's streams leave a hub that refuses connections for the next one at once,
as an agent's sender does, instead of waiting out a backoff (bench (c) SIGKILLs a hub)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from gpuscope.agent.sender import Backoff
from gpuscope.loadgen.sender import _Worker
from gpuscope.loadgen.traffic import shard_of
from support import QuietHandler, free_port, loopback_http


class _Accepting(QuietHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.reply(200, b'{"accepted": {"samples": 1, "events": 0, "training": 0}}', "application/json")


@pytest.fixture
def live_hub() -> Iterator[str]:
    with loopback_http(_Accepting) as url:
        yield url


def test_a_stream_whose_hub_refuses_connections_moves_to_the_next_hub_at_once(live_hub: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: what a SIGKILLed hub's port answers
    sender = next(f"node-{i}" for i in range(100) if shard_of(f"node-{i}", 2) == 0)  # on the dead hub

    async def run() -> tuple[int, int, int]:
        worker = _Worker([dead, live_hub], None, 4, 10.0, 16)
        worker.backoff = Backoff(initial=5.0, jitter=0.0)  # a backoff would outlast the wait below
        worker.enqueue(time.time(), [(sender, b"{}", 1, 1, 0, 0, False)])
        stats = await worker.finish(grace=2.0)
        return stats.batches_acked, stats.batches_unacked, stats.connect_errors

    acked, unacked, refused = asyncio.run(run())
    assert (acked, unacked, refused) == (1, 0, 1)
