"""Serving a hub over HTTP (uvicorn on one bound socket), in this thread or a background one."""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import logging
import os
import socket
import threading
import time

import uvicorn

from gpuscope.alert.service import AlertingService
from gpuscope.cluster.member import ClusterMember
from gpuscope.evaluator import Evaluator
from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits
from gpuscope.lineage import LineageRegistry
from gpuscope.tls import TlsSettings
from gpuscope.web.api import HubApi
from gpuscope.web.auth import AuthSettings
from gpuscope.web.http_protocol import HttpProtocol
from gpuscope.web.lean_ingest import lean_protocol

log = logging.getLogger("gpuscope.hub")


def _fast_loop() -> dict[str, str]:
    """uvloop when installed (a pinned dependency except on Windows), else asyncio's loop, which
    costs the hub more CPU per request. The HTTP parser is always httptools' C one
    (:mod:`gpuscope.web.http_protocol`)."""
    try:
        importlib.import_module("uvloop")
    except ImportError:
        log.info("uvloop is not installed: uvicorn's default loop is used")
        return {}
    return {"loop": "uvloop"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HubServer:
    """A hub listening on HOST:PORT, in the current thread (:meth:`run`) or a background one.

    ``auth`` (scoped tokens; or ``tokens``, plain ones with every scope) guards the API: off
    loopback a token is required for reads too. ``tls`` serves HTTPS from its certificate files.
    Built alone it also runs the hub's clock and closes the store when it stops; the runtime
    (:mod:`gpuscope.runtime`) passes ``evaluate_interval=None, close_store=False`` and does both
    in its own order. ``lean_ingest`` serves agents' batches from the HTTP parser's callbacks
    (:mod:`gpuscope.web.lean_ingest`); off, they take the ASGI path like every other request.
    With ``accept=False`` it binds the socket but accepts nothing on it: ingest workers do
    (:mod:`gpuscope.web.ingest_workers`), and hand it every other connection (:meth:`adopt`).
    """

    def __init__(
        self,
        hub: Hub,
        host: str,
        port: int,
        *,
        tokens: list[str] | None = None,
        limits: Limits | None = None,
        evaluate_interval: float | None = 1.0,
        auth: AuthSettings | None = None,
        tls: TlsSettings | None = None,
        alerting: AlertingService | None = None,
        lineage: LineageRegistry | None = None,
        cluster: ClusterMember | None = None,
        close_store: bool = True,
        lean_ingest: bool = True,
        accept: bool = True,
    ) -> None:
        auth = auth if auth is not None else AuthSettings.from_plain(tokens or [])
        if not is_loopback(host) and not auth.tokens:
            raise ValueError(
                f"refusing to listen on {host} without an auth token: set auth.tokens in the "
                "config or GPUSCOPE_TOKEN, or listen on 127.0.0.1"
            )
        ssl_context = tls.server_context() if tls is not None else None  # bad files: ValueError now
        self.hub = hub
        self.tls = tls
        self.api = HubApi(
            hub,
            auth=auth,
            limits=limits,
            open_reads=is_loopback(host),
            alerting=alerting,
            lineage=lineage,
            cluster=cluster,
        )
        # proto must say TCP: asyncio only sets TCP_NODELAY on sockets that do, and without it
        # every small response waits out the client's delayed ACK (about 40 ms).
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        hub.overload.name = f"{socket.gethostname()}:{self.port}"  # names its hub_overloaded alert
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.api.asgi,
                log_level="warning",
                access_log=False,
                server_header=False,
                http=lean_protocol(self.api.lean) if lean_ingest else HttpProtocol,
                **_fast_loop(),  # type: ignore[arg-type]
                timeout_keep_alive=30,
                # on SIGTERM, requests still queued behind a backlog are dropped after 10 s rather
                # than served for minutes: none of them was acknowledged, so the senders retry them
                timeout_graceful_shutdown=10,
                ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context else None,
            )
        )
        self.evaluator = Evaluator(hub, evaluate_interval) if evaluate_interval is not None else None
        self.close_store = close_store
        self.accept = accept
        if not accept:  # the workers' servers listen on it too; connections queue until one runs
            self.sock.listen(self.server.config.backlog)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early: list[tuple[int, bytes]] = []  # connections handed over before the loop ran
        self._adopt_lock = threading.Lock()
        self._adopting: set[asyncio.Task[None]] = set()
        self.api.on_loop.append(self._loop_ready)

    def _sockets(self) -> list[socket.socket]:
        return [self.sock] if self.accept else []

    def adopt(self, fd: int, data: bytes) -> None:
        """Serve a connection accepted elsewhere (an ingest worker's): its descriptor, owned from
        now on, and the bytes already read from it. Any thread."""
        with self._adopt_lock:
            loop = self._loop
            if loop is None:
                self._early.append((fd, data))
                return
        try:
            loop.call_soon_threadsafe(self._adopt, fd, data)
        except RuntimeError:  # the loop closed: the server stopped
            os.close(fd)

    def _loop_ready(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._adopt_lock:
            self._loop = loop
            early, self._early = self._early, []
        for fd, data in early:
            self._adopt(fd, data)

    def _adopt(self, fd: int, data: bytes) -> None:
        """On the event loop: the connection joins the server's, as if it had accepted it."""
        if self.server.should_exit or self._loop is None:
            os.close(fd)
            return
        task = self._loop.create_task(self._connect(socket.socket(fileno=fd), data))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _connect(self, sock: socket.socket, data: bytes) -> None:
        assert self._loop is not None
        server = self.server
        config = server.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=server.server_state, app_state=server.lifespan.state
            )

        try:
            _, connection = await self._loop.connect_accepted_socket(protocol, sock)
        except OSError:
            sock.close()
            return
        connection.data_received(data)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def run(self) -> None:
        """Serve until interrupted (SIGINT/SIGTERM), then flush the store."""
        if self.evaluator is not None:
            self.evaluator.start()
        try:
            self.server.run(sockets=self._sockets())
        finally:
            self._closed()

    def start(self) -> None:
        """Serve from a background thread; returns once the server accepts connections."""
        if self.evaluator is not None:
            self.evaluator.start()
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": self._sockets()}, name="gpuscope-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the hub's HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._closed()

    def _closed(self) -> None:
        if self.evaluator is not None:
            self.evaluator.stop()
        if self.close_store:
            self.hub.store.close()
