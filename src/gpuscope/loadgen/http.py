"""A lean HTTP/1.1 client for the load generator's ingest posts: kept-alive connections, a
request head built once, responses parsed by ``httptools``.

A general client (httpx) spends about half a millisecond of CPU on each request; at 1,024 agents a
second that alone is half a core, and the generator would measure itself rather than the hub.
This one does only what an ingest post needs: ``POST`` a body, read the status, the body and
``Retry-After``. A connection that fails or times out is closed and never reused. Callers waiting
for a connection are served first come, first served, so no stream of the generator starves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from gpuscope.agent.route import OWNER_HEADER
from gpuscope.agent.sender import retry_after_seconds

OWNER_HEADER_BYTES = OWNER_HEADER.lower().encode()


class RequestError(ConnectionError):
    """The request got no complete answer (refused, reset, timed out, unparseable)."""


class ConnectFailed(RequestError):
    """No connection to the hub could be opened (refused, or no answer within the connect timeout)."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    content: bytes
    retry_after: float | None
    #: the hub owning the sender's shard, as a cluster member's answer names it
    owner: str | None = None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Reply] | None = None
        self.closed = False
        self._body: list[bytes] = []
        self._retry_after: bytes | None = None
        self._owner: bytes | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, but one

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(RequestError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.fail(RequestError(f"connection lost: {exc}" if exc else "connection closed"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"retry-after":
            self._retry_after = value
        elif lower == OWNER_HEADER_BYTES:
            self._owner = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        owner = self._owner.decode("latin-1").rstrip("/") if self._owner else None
        reply = Reply(
            self.parser.get_status_code(), b"".join(self._body), retry_after_seconds(self._retry_after), owner
        )
        self._body, self._retry_after, self._owner = [], None, None
        if not self.parser.should_keep_alive():
            self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    # --
    def fail(self, exc: Exception) -> None:
        self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Reply]:
        assert self.transport is not None
        self.waiter = self.loop.create_future()
        self.transport.writelines((head, body))
        return self.waiter


class HubClient:
    """POSTs to one path of one hub over at most ``connections`` kept-alive connections."""

    def __init__(
        self,
        url: str,
        path: str,
        headers: dict[str, str],
        connections: int,
        timeout: float,
        connect_timeout: float | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the load generator speaks plain http to a hub, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", *(f"{k}: {v}" for k, v in headers.items())]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else min(timeout, connect_timeout)
        self.size = connections
        self._idle: deque[_Connection] = deque()
        self._open = 0
        #: callers waiting for a connection, first come first served: each is handed an open
        #: connection, or None (the right to open one in place of one that closed)
        self._waiting: deque[asyncio.Future[_Connection | None]] = deque()

    async def post(self, body: bytes, header: bytes = b"") -> Reply:
        """POST ``body``; ``header``: more header lines of this request, each ending in CRLF."""
        conn = await self._acquire()
        loop = conn.loop
        waiter = conn.send(self._head + header + b"Content-Length: %d\r\n\r\n" % len(body), body)
        timer = loop.call_later(self.timeout, conn.fail, RequestError("timed out"))
        try:
            return await waiter
        finally:
            timer.cancel()
            self._release(conn)

    async def _acquire(self) -> _Connection:
        # nobody overtakes a waiter: a stream that just got its answer and posts again goes to the
        # back of the line. Handing a free connection to whoever asks first (the stream releasing
        # it, in the same step) let a few streams keep the pool while others starved for minutes,
        # and the hub rightly took the starved ones for dead.
        if not self._waiting:
            while self._idle:
                conn = self._idle.popleft()
                if not conn.closed:
                    return conn
                self._open -= 1
            if self._open < self.size:
                self._open += 1
                return await self._connect()
        turn: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            granted = await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._hand_on(turn.result())  # handed over as the caller was cancelled: pass it on
            raise
        return granted if granted is not None else await self._connect()

    async def _connect(self) -> _Connection:
        """Open a connection in a slot already counted in ``_open``; the slot is handed on if it fails."""
        loop = asyncio.get_running_loop()
        conn = _Connection(loop)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, self.host, self.port), self.connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            self._hand_on(None)
            raise ConnectFailed(f"cannot connect: {exc}") from exc
        except asyncio.CancelledError:
            self._hand_on(None)
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        self._hand_on(None if conn.closed else conn)

    def _hand_on(self, conn: _Connection | None) -> None:
        """Give a connection (None: the slot of one that closed) to the first waiter, else keep it."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(conn)
                return
        if conn is None:
            self._open -= 1
        else:
            self._idle.append(conn)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        self._open = 0
