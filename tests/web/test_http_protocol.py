"""Each answer in one write: what the HTTP protocol writes within one loop turn goes out joined. A
client's TLS handshake or upgrade request at a plain-HTTP hub leaves no uvicorn warning behind."""

from __future__ import annotations

import asyncio
import logging
import re
import socket

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.http_protocol import FLUSH_BYTES, JoinedWrites
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
