"""``POST /api/v1/ingest`` served from the HTTP parser's callbacks, without the ASGI layers.

Every node posts a batch once a second, so what the HTTP server spends around the route counts
(issue 13: hub CPU per sample against VictoriaMetrics'). On the ASGI path uvicorn builds each
request a scope, a request-response cycle with its event, and a task running the app, which reads
the body through ``receive`` and answers through two ``send`` calls that check every header. Here
the protocol recognises ``POST /api/v1/ingest`` once the headers are parsed and serves it itself
(uvicorn's ``on_message_begin`` still starts a scope dict for every request, a microsecond's work):
the same front door (:meth:`AuthMiddleware.authorize <gpuscope.web.guard.AuthMiddleware.authorize>`:
token, scope, rate limit) and the same route steps (:class:`~gpuscope.web.ingest_route.IngestRoute`:
admission, content type, size limit, decode, durable append), called from ``on_body`` and
``on_message_complete``, and the answer written straight to the transport. No task is created: a
refusal is written at once, an acknowledgement when the store's callback says the batch is durable.

What it answers, byte for byte, is what the ASGI path answers (tests/web/test_lean_ingest.py):
the same status line, the server's ``date``, the same headers in the same order, ``connection:
close`` when the connection closes, the same body; and it counts the same refusals. It keeps
uvicorn's order on a connection: a request pipelined behind another waits in uvicorn's pipeline
until the one before it is answered, whichever path serves either.

Anything else goes down uvicorn's ASGI path untouched: other paths and methods, a query string or
an escaped path, HTTP/1.0, ``Expect: 100-continue``, upgrades, and servers configured with a root
path, a concurrency limit or an access log (which the lean path would skip).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gpuscope.ingest.overload import URGENT_EVENTS
from gpuscope.web.answer import Answer, RawHeaders
from gpuscope.web.errors import ApiError
from gpuscope.web.guard import AuthMiddleware, required_scope
from gpuscope.web.http_protocol import HttpProtocol
from gpuscope.web.ingest_route import (
    INGEST_PATH,
    SENDER,
    URGENT,
    IngestRoute,
    Outcome,
    check_declared,
    client_gone,
    header_value,
    too_large,
)

log = logging.getLogger("uvicorn.error")

_URL = INGEST_PATH.encode("ascii")
#: uvicorn's own answer to an app that raised (RequestResponseCycle.send_500_response)
SERVER_ERROR = Answer(
    500,
    [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")],
    b"Internal Server Error",
)


class LeanIngest:
    """The ingest route and the front door guarding it, as the lean path calls them."""

    def __init__(self, route: IngestRoute, guard: AuthMiddleware) -> None:
        self.route = route
        self.guard = guard
        self.need = required_scope("POST", INGEST_PATH)


def _raw_header(headers: RawHeaders, name: bytes) -> bytes:
    """The first value of header ``name`` as sent (empty when none)."""
    for key, value in headers:
        if key == name:
            return value
    return b""


class _NoEvent:
    """What uvicorn's protocol wakes when the connection is lost: a lean request waits on none."""

    def set(self) -> None:
        pass


async def _lean_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Marks a lean request in uvicorn's pipeline; never called."""
    raise RuntimeError("a lean ingest request went down the ASGI path")


class LeanRequest:
    """One ``POST /api/v1/ingest`` on a connection: the protocol's current cycle while it is
    parsed, queued behind earlier requests, served and answered."""

    message_event: ClassVar[_NoEvent] = _NoEvent()

    def __init__(self, protocol: LeanHttpProtocol, headers: RawHeaders, keep_alive: bool) -> None:
        self.protocol = protocol
        self.headers = headers
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.more_body = True
        self.chunks: list[bytes] = []
        self.size = 0
        #: while served and not answered: the overload ticket (given back once) and the media type
        self.ticket: int | None = None
        self.ctype = ""
        self.reading = False  # started, waiting for the rest of the body

    @property
    def route(self) -> IngestRoute:
        return self.protocol.ingest.route

    def start(self) -> None:
        """Its turn on the connection (a loop turn after its headers, or after the answer before it)."""
        if self.response_complete:
            return
        lean = self.protocol.ingest
        route = lean.route
        try:
            found = lean.guard.authorize(lean.need, _raw_header(self.headers, b"authorization"))
            if isinstance(found, Answer):
                self.answer(found)
                return
            ticket = route.admit(
                header_value(self.headers, SENDER),
                header_value(self.headers, URGENT),
                header_value(self.headers, b"content-length"),
            )
            if isinstance(ticket, Answer):
                self.answer(ticket)
                return
            self.ticket = ticket
            self.ctype = route.content_type(header_value(self.headers, b"content-type"))
            limit = route.limits.max_body_bytes
            check_declared(header_value(self.headers, b"content-length"), limit, route.hub.counters)
            if self.size > limit:
                raise too_large(limit, route.hub.counters)
        except ApiError as exc:
            self._release()
            self.answer(route.refusal(exc))
            return
        except Exception as exc:  # a fault of the hub's: logged and answered 500, as uvicorn does
            self._release()
            self.reply(exc)
            return
        self.reading = True
        self.protocol.serving = self
        if self.disconnected:
            self.lost()
        elif not self.more_body:
            self._take()

    def feed(self, chunk: bytes) -> None:
        """Part of the body arrived."""
        if self.response_complete:
            return
        self.chunks.append(chunk)
        self.size += len(chunk)
        if self.reading:
            limit = self.route.limits.max_body_bytes
            if self.size > limit:
                self.reading = False
                self._release()
                self.answer(self.route.refusal(too_large(limit, self.route.hub.counters)))

    def complete(self) -> None:
        """The whole body arrived."""
        self.more_body = False
        if self.reading:
            self._take()

    def lost(self) -> None:
        """The connection closed: a request waiting for its body is counted as the ASGI path
        counts it (499, never written); one whose batch is being stored keeps its ticket until the
        store answers."""
        self.disconnected = True
        if self.reading:
            self.reading = False
            self._release()
            self.route.refusal(client_gone(self.route.hub.counters))
            self.protocol.serving = None

    def _take(self) -> None:
        self.reading = False
        ticket, self.ticket = self.ticket, None
        assert ticket is not None
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = []
        urgent = header_value(self.headers, URGENT) == URGENT_EVENTS
        self.route.take(ticket, self.ctype, body, self.reply, urgent=urgent)

    def _release(self) -> None:
        if self.ticket is not None:
            self.route.hub.overload.done(self.ticket)
            self.ticket = None

    def reply(self, outcome: Outcome) -> None:
        """The route's answer; an exception is logged and answered 500, as uvicorn does."""
        if isinstance(outcome, Exception):
            log.error("Exception in ASGI application\n", exc_info=outcome)
            outcome = SERVER_ERROR
        self.answer(outcome)

    def answer(self, answer: Answer) -> None:
        """Write ``answer`` as uvicorn's ``RequestResponseCycle.send`` does, and let the next
        request on the connection go."""
        self.response_complete = True
        protocol = self.protocol
        if protocol.serving is self:
            protocol.serving = None
        if self.disconnected:
            return
        keep_alive = self.keep_alive
        content = [STATUS_LINE[answer.status]]
        for name, value in protocol.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        closes = False
        for name, value in answer.headers:
            if name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                keep_alive = False
                closes = True
            content += [name, b": ", value, b"\r\n"]
        if not keep_alive and not closes:
            content.append(b"connection: close\r\n")
        content += [b"\r\n", answer.body]
        protocol.transport.write(b"".join(content))
        if not keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()


class LeanHttpProtocol(HttpProtocol):
    """:class:`HttpProtocol` serving ``POST /api/v1/ingest`` itself (see the module docstring);
    :func:`lean_protocol` makes one for a hub."""

    ingest: ClassVar[LeanIngest]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # the configured access log (uvicorn logs to any handler found, such as a test run's capture)
        self.lean_on = not self.root_path and self.limit_concurrency is None and not self.config.access_log
        #: the lean request whose headers were parsed last, while its body arrives
        self.parsing: LeanRequest | None = None
        #: the lean request being served (started, not answered)
        self.serving: LeanRequest | None = None

    def on_message_begin(self) -> None:
        # a request is arriving: the connection is not idle (a lean answer written while the
        # parser ran may have armed the keep-alive timeout)
        self._unset_keepalive_if_required()
        self.parsing = None
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        parser = self.parser
        if not (
            self.lean_on
            and self.url == _URL
            and parser.get_method() == b"POST"
            and parser.get_http_version() == "1.1"
            and not self.expect_100_continue
            and not parser.should_upgrade()
        ):
            super().on_headers_complete()
            return
        request = LeanRequest(self, self.headers, parser.should_keep_alive())
        self.parsing = request
        earlier = self.cycle
        self.cycle = request  # type: ignore[assignment]
        if earlier is None or earlier.response_complete:
            self.loop.call_soon(request.start)
        else:  # pipelined: its turn comes once the request before it is answered
            self.flow.pause_reading()
            self.pipeline.appendleft((request, _lean_app))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        if self.parsing is None:
            super().on_body(body)
        else:
            self.parsing.feed(body)

    def on_message_complete(self) -> None:
        if self.parsing is None:
            super().on_message_complete()
        else:
            self.parsing.complete()

    def _start_asgi_task(self, cycle: object, app: object) -> None:
        if app is _lean_app:
            self.loop.call_soon(cycle.start)  # type: ignore[attr-defined]
        else:
            super()._start_asgi_task(cycle, app)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.serving is not None:
            self.serving.lost()
        if self.parsing is not None:
            self.parsing.disconnected = True
        super().connection_lost(exc)


def lean_protocol(ingest: LeanIngest) -> type[LeanHttpProtocol]:
    """The protocol class a hub's server uses: :class:`LeanHttpProtocol` serving ``ingest``."""
    return type("HubHttpProtocol", (LeanHttpProtocol,), {"ingest": ingest})
