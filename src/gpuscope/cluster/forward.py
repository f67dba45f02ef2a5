"""Passing batch parts to the hubs that own them: one bounded queue and one sender per peer.

The sender posts every part queued meanwhile in one request (up to :data:`.parts.MAX_REQUEST_PARTS`
parts and :data:`.parts.MAX_REQUEST_BYTES`), as binary frames (:mod:`.parts`).

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

from gpuscope.cluster import parts
from gpuscope.cluster.config import ClusterConfig
from gpuscope.counters import Counters
from gpuscope.model import Batch

log = logging.getLogger("gpuscope.cluster.forward")

OBSERVE_PATH = "/api/v1/cluster/forward"
HOPS_HEADER = "x-gpuscope-hops"

Reroute = Callable[[Batch, int], object]


class Forwarder:
    def __init__(
        self,
        cfg: ClusterConfig,
        url_of: Callable[[str], str | None],
        reroute: Reroute,
        counters: Counters,
        transport: httpx.BaseTransport | None = None,
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
            headers={"authorization": f"Bearer {cfg.peer_token}", "content-type": parts.CONTENT_TYPE},
            transport=transport,
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
            first = q.get()
            if first is None:
                return
            taken, last = self._take(first, q)
            groups: dict[int, list[tuple[Batch, bytes]]] = {}
            for part, hops in taken:
                groups.setdefault(hops, []).append((part, parts.encode_part(part)))
            for hops, group in groups.items():
                if self._post(hub, hops, group):
                    return
            if last:
                return

    @staticmethod
    def _take(
        first: tuple[Batch, int], q: queue.Queue[tuple[Batch, int] | None]
    ) -> tuple[list[tuple[Batch, int]], bool]:
        """``first`` and the parts queued behind it that fit one request; and whether the stop
        mark was among them."""
        taken = [first]
        while len(taken) < parts.MAX_REQUEST_PARTS:
            try:
                item = q.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return taken, True
            taken.append(item)
        return taken, False

    def _post(self, hub: str, hops: int, group: list[tuple[Batch, bytes]]) -> bool:
        """Send ``group`` (parts with their frames) in requests of at most MAX_REQUEST_BYTES; on a
        failure route its parts again after a renewal. True when the forwarder stopped meanwhile."""
        requests: list[list[tuple[Batch, bytes]]] = [[]]
        size = 0
        for item in group:
            if requests[-1] and size + len(item[1]) > parts.MAX_REQUEST_BYTES:
                requests.append([])
                size = 0
            requests[-1].append(item)
            size += len(item[1])
        for request in requests:
            url = self.url_of(hub)
            try:
                if url is None:
                    raise httpx.ConnectError(f"{hub} is not a live member")
                reply = self._client.post(
                    url + OBSERVE_PATH,
                    content=parts.encode_parts([body for _, body in request]),
                    headers={HOPS_HEADER: str(hops)},
                )
                reply.raise_for_status()
                self.counters.inc("cluster_forwarded", len(request))
                self.counters.inc("cluster_forward_requests")
            except httpx.HTTPError as exc:
                self.counters.inc("cluster_forward_failed", len(request))
                log.info("forwarding %d parts to %s failed (%s); routing again", len(request), hub, exc)
                if self._stop.wait(self.cfg.renew_s):
                    return True
                for part, _ in request:
                    self.reroute(part, hops)
        return False

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
