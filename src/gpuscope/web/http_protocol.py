"""uvicorn's C-parser (httptools) protocol, writing each response in one piece.

uvicorn writes a response's status line and headers as soon as the app sends them, and then its
body: two ``send`` calls and two TCP segments for every small JSON answer, the hub's usual one
(each agent's batch is acknowledged with about 120 bytes). On loopback and in a LAN a ``send`` is
one of the dearest steps of a request. Here what the protocol writes within one turn of the event
loop is joined and written once at the end of that turn (or at once past 64 KiB, so a long
streamed answer is never held). Order, flow control and closing behave as before: the joined bytes
go out before the connection closes, and the real transport still pauses the protocol when its
buffer fills.

The keep-alive timeout (a connection idle for ``timeout_keep_alive`` seconds after its last
answer is closed) is kept by an :class:`IdleTimer`: uvicorn cancels a timer at every request's
first bytes and arms a new one at every answer, two timer operations of the event loop per request
on connections that agents keep busy every second; the idle timer stays armed and, when it fires
on a connection that was busy meanwhile, arms itself again for what is left of the timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: joined bytes past this are written at once
FLUSH_BYTES = 64 * 1024
#: how a TLS connection starts: a handshake record (content type 22) of TLS 1.0-1.3 (record version 3.x)
TLS_HANDSHAKE = b"\x16\x03"
#: an idle timer firing this close to the timeout closes (the loop's clock ticks in milliseconds)
IDLE_SLACK_S = 0.005

log = logging.getLogger("gpuscope.web.http")


class JoinedWrites(asyncio.Transport):
    """A transport that joins the writes of one event-loop turn into one write of ``inner``."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.inner = inner
        self.loop = loop
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self.loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what is pending (called at the end of the loop turn that wrote it)."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self.inner.is_closing():
            self.inner.write(data)

    def close(self) -> None:
        self.flush()
        self.inner.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self.inner.abort()

    def write_eof(self) -> None:
        self.flush()
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()


class IdleTimer:
    """Calls ``expired`` once a connection has been idle for ``timeout`` seconds: idle from
    :meth:`idle` (an answer complete, nothing queued) until :meth:`busy` (data arrived)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, expired: Callable[[], None]) -> None:
        self.loop = loop
        self.timeout = timeout
        self.expired = expired
        #: the loop's time the connection fell idle; None while busy
        self.idle_since: float | None = None
        self.handle: asyncio.TimerHandle | None = None

    def idle(self) -> None:
        self.idle_since = self.loop.time()
        if self.handle is None:
            self.handle = self.loop.call_later(self.timeout, self._fired)

    def busy(self) -> None:
        # the armed timer stays: when it fires on a busy connection it does nothing
        self.idle_since = None

    def stop(self) -> None:
        self.idle_since = None
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fired(self) -> None:
        self.handle = None
        if self.idle_since is None:
            return
        left = self.idle_since + self.timeout - self.loop.time()
        if left > IDLE_SLACK_S:  # busy and idle again since the timer was armed
            self.handle = self.loop.call_later(left, self._fired)
            return
        self.idle_since = None
        self.expired()


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over :class:`JoinedWrites`.

    A client that speaks TLS to a plain-HTTP hub (``https://`` for ``http://``) is answered as
    uvicorn answers it (400, connection closed) without uvicorn's ``Invalid HTTP request
    received.`` warning: that line names neither the client nor the cause, and the client's own
    error (``wrong version number``) already tells its user. An upgrade request (h2c, websocket)
    is answered over HTTP/1.1 without uvicorn's advice to install a websocket library. The
    keep-alive timeout is an :class:`IdleTimer`'s (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_timer = IdleTimer(self.loop, self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(JoinedWrites(transport, self.loop))
        self._first_data = True

    def data_received(self, data: bytes) -> None:
        if self._first_data and data.startswith(TLS_HANDSHAKE) and self.scheme == "http":
            log.debug("a TLS handshake from %s on a plain-HTTP port: answered 400", self.client)
            self.send_400_response("This port speaks plain HTTP: use http://, not https://.")
            return
        self._first_data = False
        super().data_received(data)

    def _unsupported_upgrade_warning(self) -> None:
        # an h2c (curl --http2) or websocket upgrade: the request is answered over HTTP/1.1, and
        # uvicorn's advice to install a websocket library does not apply to a hub that serves none
        log.debug("an upgrade request from %s answered over HTTP/1.1", self.client)

    def _unset_keepalive_if_required(self) -> None:
        self.idle_timer.busy()

    def on_response_complete(self) -> None:
        # uvicorn's (0.54), the keep-alive timeout kept by the idle timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.idle_timer.busy()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.idle_timer.idle()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.idle_timer.stop()
