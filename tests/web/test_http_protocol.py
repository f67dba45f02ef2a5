"""Each answer in one write: what the HTTP protocol writes within one loop turn goes out joined."""

from __future__ import annotations

import asyncio
import socket

from gpuscope.web.http_protocol import FLUSH_BYTES, JoinedWrites


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
