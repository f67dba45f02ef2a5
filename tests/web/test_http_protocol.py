"""Each answer in one write: what the HTTP protocol writes within one loop turn goes out joined. A
client's TLS handshake or upgrade request at a plain-HTTP hub leaves no uvicorn warning behind. An
idle keep-alive connection is closed after the timeout, without a timer per request."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable

import pytest

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.http_protocol import FLUSH_BYTES, IdleTimer, JoinedWrites
from gpuscope.web.server import HubServer


async def _pair() -> tuple[JoinedWrites, socket.socket]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    return JoinedWrites(transport, loop), peer  # type: ignore[arg-type]


def _read(peer: socket.socket) -> bytes:
    try:
        return peer.recv(1 << 20)
    except BlockingIOError:
        return b""


def test_the_writes_of_one_turn_leave_once_at_its_end_and_before_a_close() -> None:
    async def run() -> None:
        joined, peer = await _pair()
        joined.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        joined.write(b"{}")
        assert _read(peer) == b""  # nothing yet within the turn
        assert joined.get_write_buffer_size() == 40
        await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert _read(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        joined.write(b"last")
        joined.close()  # what is pending goes out before the connection closes
        await asyncio.sleep(0.01)
        assert _read(peer) == b"last" and _read(peer) == b""  # then EOF
        peer.close()

    asyncio.run(run())


def test_a_long_answer_is_not_held_past_the_flush_size() -> None:
    async def run() -> None:
        joined, peer = await _pair()
        joined.write(b"x" * (FLUSH_BYTES - 1))
        joined.write(b"y")
        await asyncio.sleep(0.01)
        got = b""
        while len(got) < FLUSH_BYTES:
            got += _read(peer)
        assert got == b"x" * (FLUSH_BYTES - 1) + b"y"
        joined.abort()
        peer.close()

    asyncio.run(run())


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _exchange(port: int, request: bytes) -> bytes:
    """One answer to ``request`` on a new connection: its head and its body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length and (chunk := s.recv(65536)):
            body += chunk
        return head + b"\r\n\r\n" + body


def test_tls_or_an_upgrade_at_a_plain_hub_is_answered_without_uvicorn_s_warnings() -> None:
    """Before: a TLS client at a plain-HTTP hub (``https://`` for ``http://``) printed uvicorn's
    ``WARNING:  Invalid HTTP request received.`` into the hub's or the demo's output, and ``curl
    --http2`` printed advice to install a websocket library."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    server = HubServer(hub, "127.0.0.1", 0, evaluate_interval=None)
    kept = Kept()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(kept)
    server.start()
    try:
        client_hello = b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32)
        answer = _exchange(server.port, client_hello)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert answer.endswith(b"This port speaks plain HTTP: use http://, not https://.")
        h2c = (
            b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        assert _exchange(server.port, h2c).startswith(b"HTTP/1.1 200 ")  # served, not upgraded
        # a request that is simply malformed is still reported: the log is being read
        assert _exchange(server.port, b"GET / HTTP/1.1\r\nContent-Length: zz\r\n\r\n").startswith(
            b"HTTP/1.1 400"
        )
    finally:
        server.stop()
        uvicorn_log.removeHandler(kept)
    warnings = [line for line in kept.lines if line.startswith("WARNING")]
    assert warnings == ["WARNING Invalid HTTP request received."]


class Handle:
    def __init__(self) -> None:
        self.off = False

    def cancel(self) -> None:
        self.off = True


class ManualLoop:
    """The two calls an idle timer makes of its loop, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None], Handle]] = []
        self.armed = 0

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        self.armed += 1
        handle = Handle()
        self.timers.append((self.now + delay, callback, handle))
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock, firing what falls due in order (and what they arm meanwhile)."""
        end = self.now + seconds
        while due := sorted((t for t in self.timers if t[0] <= end), key=lambda t: t[0]):
            when, callback, handle = due[0]
            self.timers.remove(due[0])
            self.now = max(self.now, when)
            if not handle.off:
                callback()
        self.now = end


def _timer(timeout: float = 30.0) -> tuple[ManualLoop, IdleTimer, list[float]]:
    loop = ManualLoop()
    closed: list[float] = []
    timer = IdleTimer(loop, timeout, lambda: closed.append(loop.now))  # type: ignore[arg-type]
    return loop, timer, closed


def test_an_idle_connection_is_closed_when_the_keep_alive_timeout_has_passed_since_its_last_answer() -> None:
    loop, timer, closed = _timer()
    timer.idle()
    loop.advance(29.9)
    assert closed == []
    loop.advance(0.2)
    assert closed == [30.0]
    loop.advance(100)
    assert closed == [30.0]  # once


def test_a_connection_busy_every_second_is_never_closed_and_its_timer_is_not_rearmed_per_request() -> None:
    loop, timer, closed = _timer()
    for _ in range(300):  # a request a second, answered at once: busy, then idle again
        timer.busy()
        timer.idle()
        loop.advance(1.0)
    assert closed == []
    # about once a timeout (uvicorn's own timer: one cancelled and one armed per request)
    assert loop.armed <= 12
    loop.advance(28.9)  # the last answer was at 299 s
    assert closed == []
    loop.advance(0.2)
    assert closed == pytest.approx([329.0])  # 30 s after it, as uvicorn's timer would


def test_a_connection_busy_when_the_timer_fires_stays_open_until_the_timeout_after_its_next_answer() -> None:
    loop, timer, closed = _timer(timeout=10.0)
    timer.idle()
    loop.advance(5.0)
    timer.busy()  # a request arrives at 5 s and takes 20 s to answer
    loop.advance(20.0)
    assert closed == []
    timer.idle()  # answered at 25 s
    loop.advance(9.0)
    assert closed == []
    loop.advance(2.0)
    assert closed == pytest.approx([35.0])


def test_a_stopped_timer_never_closes() -> None:
    loop, timer, closed = _timer(timeout=10.0)
    timer.idle()
    timer.stop()
    loop.advance(60.0)
    assert closed == []


def test_a_served_connection_stays_open_between_requests_and_is_closed_once_idle() -> None:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    server = HubServer(hub, "127.0.0.1", 0, evaluate_interval=None)
    server.server.config.timeout_keep_alive = 1
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
            for _ in range(3):  # kept alive: three answers on one connection
                s.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while b"\r\n\r\n" not in answer:
                    answer += s.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200 ")
                head, _, body = answer.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
                while len(body) < length:
                    body += s.recv(65536)
            assert s.recv(65536) == b""  # then idle past the timeout: the hub closed it
    finally:
        server.stop()
