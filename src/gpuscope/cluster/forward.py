"""Passing batch parts to the hubs that own them: one bounded queue and one sender per peer.

A full queue drops the part (counted): detection on that shard misses it, but the data itself
was already stored by the hub that received it. A part that cannot be delivered (the peer died)
is routed again by current ownership after one renewal period, up to the hop limit.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable

import httpx

from gpuscope.cluster.config import ClusterConfig
from gpuscope.counters import Counters
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch

log = logging.getLogger("gpuscope.cluster.forward")

OBSERVE_PATH = "/api/v1/cluster/forward"
HOPS_HEADER = "x-gpuscope-hops"

Reroute = Callable[[Batch, int], object]


class Forwarder:
    def __init__(
        self, cfg: ClusterConfig, url_of: Callable[[str], str | None], reroute: Reroute, counters: Counters
    ) -> None:
        self.cfg = cfg
        self.url_of = url_of
        self.reroute = reroute
        self.counters = counters
        self._queues: dict[str, queue.Queue[tuple[Batch, int] | None]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._urls: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client = httpx.Client(
            timeout=5.0,
            headers={"authorization": f"Bearer {cfg.peer_token}", "content-type": "application/json"},
        )

    def start(self) -> None:
        self._stop.clear()

    def send(self, hub: str, part: Batch, hops: int) -> None:
        """Queue a part for ``hub``; a full queue drops it (counted)."""
        with self._lock:
            q = self._queues.get(hub)
            if q is None:
                q = self._queues[hub] = queue.Queue(self.cfg.forward_queue)
                thread = threading.Thread(
                    target=self._run, args=(hub, q), name=f"gpuscope-fwd-{hub}", daemon=True
                )
                self._threads[hub] = thread
                thread.start()
        try:
            q.put_nowait((part, hops))
        except queue.Full:
            self.counters.inc("cluster_forward_dropped")

    def _run(self, hub: str, q: queue.Queue[tuple[Batch, int] | None]) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            part, hops = item
            url = self.url_of(hub)
            try:
                if url is None:
                    raise httpx.ConnectError(f"{hub} is not a live member")
                reply = self._client.post(
                    url + OBSERVE_PATH, content=encode_batch(part), headers={HOPS_HEADER: str(hops)}
                )
                reply.raise_for_status()
                self.counters.inc("cluster_forwarded")
            except httpx.HTTPError as exc:
                self.counters.inc("cluster_forward_failed")
                log.info("forwarding to %s failed (%s); routing again", hub, exc)
                if self._stop.wait(self.cfg.renew_s):
                    return
                self.reroute(part, hops)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {hub: q.qsize() for hub, q in self._queues.items()}

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for q in self._queues.values():
                with contextlib.suppress(queue.Full):  # a full queue's sender sees the stop flag
                    q.put_nowait(None)
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout=5)
        self._client.close()
