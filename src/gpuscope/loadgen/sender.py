"""A sender process of the load generator: many agents' in-order streams over asyncio + httpx.

Each sender (a node's agent, a job's SDK process) is one stream: its batches go out one at a
time, in order, as a real agent's do; a batch that fails (connection error, 5xx, 408, 429) is
retried with the agent's backoff, on the next hub when there are several, until it is
acknowledged or the run's grace period ends, and batches behind it wait. A stream follows the
owner of its shard that a cluster member's answer names, as an agent does. What is still
unacknowledged at the end is a drop. Connections are kept alive, a pool per hub per process,
through the lean client of :mod:`gpuscope.loadgen.http` on uvloop; bodies are binary frames.
"""

from __future__ import annotations

import asyncio
import random
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import orjson
import uvloop

from gpuscope import __version__
from gpuscope.agent.route import CONNECT_TIMEOUT_S
from gpuscope.agent.sender import INGEST_PATH, Backoff
from gpuscope.ingest.frame import CONTENT_TYPE
from gpuscope.ingest.overload import SENDER_HEADER, URGENT_EVENTS, URGENT_HEADER, sender_header
from gpuscope.loadgen.http import ConnectFailed, HubClient, Reply, RequestError
from gpuscope.loadgen.traffic import shard_of

#: (sender, body, rows, samples, events, training, urgent) as the main process ships them
Item = tuple[str, bytes, int, int, int, int, bool]
#: the header line of an urgent request (events only, sent ahead of the spool)
URGENT_LINE = f"{URGENT_HEADER}: {URGENT_EVENTS}\r\n".encode("latin-1")


@dataclass(slots=True)
class SenderStats:
    """What a sender process saw; merged over processes by :meth:`merge`."""

    batches_offered: int = 0
    batches_acked: int = 0
    batches_refused: int = 0
    batches_unacked: int = 0
    batches_overflowed: int = 0  # dropped oldest-first when a stream's backlog was full
    batches_died: int = 0  # queued by a sender a fault killed (its spool died with it): not sent
    duplicates: int = 0
    retries: int = 0
    connect_errors: int = 0
    rows_acked: int = 0
    samples_offered: int = 0
    samples_acked: int = 0
    samples_refused: int = 0  # values the hub refused inside accepted batches (counted, named in notes)
    events_acked: int = 0
    training_acked: int = 0
    http_errors: dict[int, int] = field(default_factory=dict)
    refusal_messages: list[str] = field(default_factory=list)
    latencies: array[float] = field(default_factory=lambda: array("d"))  # seconds per request
    lags: array[float] = field(default_factory=lambda: array("d"))  # due time → acknowledged
    acked_per_second: dict[int, int] = field(default_factory=dict)  # wall second → samples

    def merge(self, other: SenderStats) -> None:
        for name in (
            "batches_offered",
            "batches_acked",
            "batches_refused",
            "batches_unacked",
            "batches_overflowed",
            "batches_died",
            "duplicates",
            "retries",
            "connect_errors",
            "rows_acked",
            "samples_offered",
            "samples_acked",
            "samples_refused",
            "events_acked",
            "training_acked",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for code, n in other.http_errors.items():
            self.http_errors[code] = self.http_errors.get(code, 0) + n
        self.refusal_messages.extend(other.refusal_messages[: 10 - len(self.refusal_messages)])
        self.latencies.extend(other.latencies)
        self.lags.extend(other.lags)
        for sec, n in other.acked_per_second.items():
            self.acked_per_second[sec] = self.acked_per_second.get(sec, 0) + n


def sender_line(sender: str) -> bytes:
    """The ``X-Gpuscope-Sender`` header line of a stream: an agent's node, an SDK's job, or one
    rank's SDK (``sdk:<job>#<rank>``)."""
    job = sender.removeprefix("sdk:")
    labels = {"node": sender}
    if job != sender:
        name, mark, rank = job.rpartition("#")
        labels = {"job": name, "rank": rank} if mark else {"job": job}
    return f"{SENDER_HEADER}: {sender_header(labels)}\r\n".encode("latin-1")


@dataclass(slots=True)
class _Stream:
    hub: int
    header: bytes
    queue: deque[tuple[float, Item]] = field(default_factory=deque)
    #: events only, sent ahead of the queue (an agent's urgent lane); never dropped for room
    urgent: deque[tuple[float, Item]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    dead: bool = False  # a fault killed the sender: it sends nothing more


class _Worker:
    def __init__(
        self, hubs: list[str], token: str | None, connections: int, timeout: float, max_backlog: int
    ) -> None:
        self.max_backlog = max_backlog
        headers = {"Content-Type": CONTENT_TYPE, "User-Agent": f"gpuscope-loadgen/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.clients = [
            HubClient(h, INGEST_PATH, headers, connections, timeout, CONNECT_TIMEOUT_S) for h in hubs
        ]
        #: a cluster member names the hub owning a stream's shard: the stream goes there, as an agent's
        self._hub_index = {h.rstrip("/"): i for i, h in enumerate(hubs)}
        self.streams: dict[str, _Stream] = {}
        self.stats = SenderStats()
        self.backoff = Backoff()
        self.rng = random.Random()

    def kill(self, senders: list[str]) -> None:
        """A fault killed these senders: what they had queued dies with them, and they stop
        knocking (a request already on its way is answered, and nothing follows it)."""
        for sender in senders:
            stream = self.streams.get(sender)
            if stream is None:
                stream = self.streams[sender] = _Stream(hub=0, header=sender_line(sender))
            stream.dead = True
            self.stats.batches_died += len(stream.queue) + len(stream.urgent)
            stream.queue.clear()
            stream.urgent.clear()

    def enqueue(self, due: float, items: list[Item]) -> None:
        hubs = len(self.clients)
        for item in items:
            sender = item[0]
            stream = self.streams.get(sender)
            if stream is None:
                stream = self.streams[sender] = _Stream(
                    hub=shard_of(sender, hubs), header=sender_line(sender)
                )
            if stream.dead:
                self.stats.batches_died += 1
                continue
            if item[6]:
                stream.urgent.append((due, item))
            elif len(stream.queue) >= self.max_backlog:
                # a real agent's spool is bounded too: the oldest batch waiting (not the one in flight) goes
                del stream.queue[1]
                self.stats.batches_overflowed += 1
            if not item[6]:
                stream.queue.append((due, item))
            self.stats.batches_offered += 1
            self.stats.samples_offered += item[3]
            if stream.task is None:
                stream.task = asyncio.create_task(self._drain(stream))

    async def _drain(self, stream: _Stream) -> None:
        failures = 0
        st = self.stats
        while stream.queue or stream.urgent:
            lane = stream.urgent or stream.queue
            due, (_, body, rows, samples, events, training, urgent) = lane[0]
            # a retry goes to the next hub: any hub takes any agent's batches
            client = self.clients[(stream.hub + failures) % len(self.clients)]
            retry_after: float | None = None
            started = time.perf_counter()
            try:
                resp = await client.post(body, stream.header + URGENT_LINE if urgent else stream.header)
            except ConnectFailed:
                st.connect_errors += 1
                if failures + 1 < len(self.clients):  # a hub is gone: the next one at once, as an agent
                    failures += 1
                    st.retries += 1
                    continue
            except RequestError:
                st.connect_errors += 1
            else:
                st.latencies.append(time.perf_counter() - started)
                status = resp.status
                if stream.dead:
                    break  # killed while this request was on its way: its queue is gone
                if 200 <= status < 300:
                    lane.popleft()
                    failures = 0
                    stream.hub = self._hub_index.get(resp.owner or "", stream.hub)
                    self._acked(resp, due, rows, samples, events, training)
                    continue
                st.http_errors[status] = st.http_errors.get(status, 0) + 1
                if status not in (408, 429) and status < 500:
                    lane.popleft()  # a permanent refusal: never acknowledged, a drop
                    st.batches_refused += 1
                    if len(st.refusal_messages) < 10:
                        st.refusal_messages.append(f"HTTP {status}: {resp.text[:300]}")
                    continue
                retry_after = resp.retry_after
            failures += 1
            st.retries += 1
            # the hub's Retry-After as given, as the agent honours it: an escalated backoff (up to
            # 10 s) would keep a refused stream away past its silence threshold, silent on the wire
            if retry_after is not None:
                delay = min(max(retry_after, self.backoff.initial), self.backoff.max_retry_after)
            else:
                delay = self.backoff.delay(failures, self.rng)
            await asyncio.sleep(delay)
        stream.task = None

    def _acked(self, resp: Reply, due: float, rows: int, samples: int, events: int, training: int) -> None:
        st = self.stats
        now = time.time()
        st.lags.append(now - due)
        st.batches_acked += 1
        st.rows_acked += rows
        try:
            answer: Any = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            answer = None
        accepted = answer.get("accepted") if isinstance(answer, dict) else None
        duplicate = isinstance(answer, dict) and bool(answer.get("duplicate"))
        if duplicate:
            # a retry of a batch whose first reply was lost: the hub stored it then, in full, and
            # answers with zero counts now, so what it holds of this batch is what was offered
            st.duplicates += 1
        elif isinstance(accepted, dict):
            samples = int(accepted.get("samples", samples))
            events = int(accepted.get("events", events))
            training = int(accepted.get("training", training))
            refused = answer.get("refused")
            if isinstance(refused, dict) and refused.get("samples"):
                st.samples_refused += int(refused["samples"])
                if len(st.refusal_messages) < 10:
                    st.refusal_messages.append(f"refused samples: {answer.get('notes')}"[:300])
        st.samples_acked += samples
        st.events_acked += events
        st.training_acked += training
        sec = int(now)
        st.acked_per_second[sec] = st.acked_per_second.get(sec, 0) + samples

    async def finish(self, grace: float) -> SenderStats:
        """Wait up to ``grace`` seconds for every stream to drain; what is left is unacknowledged."""
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for stream in self.streams.values():
            self.stats.batches_unacked += len(stream.queue) + len(stream.urgent)
            if stream.task is not None:
                stream.task.cancel()
        for client in self.clients:
            client.close()
        return self.stats


async def _serve(conn: Connection, worker: _Worker) -> SenderStats:
    loop = asyncio.get_running_loop()
    while True:
        message = await loop.run_in_executor(None, conn.recv)
        if message[0] == "tick":
            worker.enqueue(message[1], message[2])
        elif message[0] == "kill":
            worker.kill(message[1])
        else:
            return await worker.finish(float(message[1]))


def worker_main(
    conn: Connection, hubs: list[str], token: str | None, connections: int, timeout: float, max_backlog: int
) -> None:
    """Entry point of a sender process: ``("tick", due, items)`` and ``("kill", senders)``
    messages, then ``("stop", grace)``; answers with its :class:`SenderStats`."""

    async def main() -> SenderStats:
        return await _serve(conn, _Worker(hubs, token, connections, timeout, max_backlog))

    conn.send(uvloop.run(main()))
    conn.close()
