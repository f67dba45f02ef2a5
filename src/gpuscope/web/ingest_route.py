"""``POST /api/v1/ingest``: an agent's, an SDK's or a relay's batch, stored durably before the answer.

Every node posts here once a second, so this route is a plain ASGI app rather than a Starlette
handler: it reads the two or three headers it needs from the raw header list, the body straight
from ``receive``, and answers with orjson, without a ``Request``, a ``JSONResponse`` or Starlette's
per-request exception wrapper. It still sits behind the same front door as every route
(:class:`~gpuscope.web.guard.AuthMiddleware`: token, scope, rate limit), and what it answers is what
the handlers answer: a refusal is ``{"error": ..., "field": ...}`` with its status, counted as
``api_refused_<status>``. A hub's server serves this route from its HTTP parser's callbacks
instead (:mod:`gpuscope.web.lean_ingest`), through the same steps (:class:`IngestRoute`'s methods)
and with the same answers; this ASGI form serves everything that path leaves to uvicorn.

Order of the checks: authorised (the middleware ran), admitted by the overload monitor (503 and
``Retry-After`` before the body is read while the hub is behind), a content type it decodes (415),
a body within the size limit (413), then decode, validation and the durable append (400 naming the
field, 503/507 when storage fails).

Where the store can start an append without waiting (:meth:`Hub.ingest_then`: the DuckDB store
writes the batch's record to its ingest log), the event loop decodes, validates and writes, and
awaits the log's sync, which the log's own thread runs for every record written meanwhile; the
answer leaves once the batch is durable, as before. A request then costs no hop to a worker thread
and back, and no worker thread contends with the loop for the interpreter: on agents' traffic the
hub's context switches went from about 17 to 10 a request (bench/bench_hub_cpu.py). Other stores
(the remote ones, whose appends are round trips) append on a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope.agent.route import OWNER_HEADER
from gpuscope.counters import Counters
from gpuscope.ingest.frame import CONTENT_TYPES, decode_body
from gpuscope.ingest.overload import (
    SENDER_HEADER,
    URGENT_EVENTS,
    URGENT_HEADER,
    OverloadMonitor,
    SenderHeaderError,
    SenderKey,
    check_urgent,
    parse_sender,
)
from gpuscope.ingest.payload import Limits, PayloadError, check_time_window
from gpuscope.model import Batch
from gpuscope.store.base import AppendResult, Durable
from gpuscope.store.errors import StoreError, StoreFull
from gpuscope.web.answer import Answer, RawHeaders, json_answer
from gpuscope.web.errors import ApiError, refusal_counter
from gpuscope.web.guard import require_principal

#: worker threads for ingest requests to stores that cannot start an append (remote stores: each
#: append waits for its round trips)
INGEST_THREADS = 32
INGEST_PATH = "/api/v1/ingest"

SENDER = SENDER_HEADER.lower().encode("latin-1")
URGENT = URGENT_HEADER.lower().encode("latin-1")
_OWNER = OWNER_HEADER.lower().encode("latin-1")

#: what a request's batch came to: its answer, or an exception no answer covers (the server
#: answers 500 and logs it)
Outcome = Answer | Exception
Reply = Callable[[Outcome], None]


class IngestTarget(Protocol):
    """Where the route's batches go: a :class:`~gpuscope.hub.Hub` (its store), or an ingest
    worker's log (:mod:`gpuscope.web.ingest_worker`); its counters and overload monitor."""

    @property
    def counters(self) -> Counters: ...

    @property
    def overload(self) -> OverloadMonitor: ...

    def ingest(self, batch: Batch) -> AppendResult: ...

    def ingest_then(self, batch: Batch, durable: Durable) -> bool: ...

    def owner_url(self, batch: Batch) -> str | None: ...


def header_value(headers: RawHeaders, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case, as servers pass names), or None."""
    for key, value in headers:
        if key == name:
            return str(value, "latin-1")
    return None


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of the request's header ``name`` (lower case), or None."""
    return header_value(scope["headers"], name)


def is_count(raw: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes '²', which ``int`` refuses."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 18


def check_declared(declared: str | None, limit: int, counters: Counters) -> None:
    """A Content-Length header (``declared``) that is a count within ``limit``: 400 or 413."""
    if declared is not None:
        if not is_count(declared):
            raise ApiError(400, "content-length", "must be an integer")
        if int(declared) > limit:
            counters.inc("ingest_refused_too_large")
            raise ApiError(413, "body", f"{declared} bytes is over the limit of {limit}")


def too_large(limit: int, counters: Counters) -> ApiError:
    """The refusal of a body found longer than ``limit`` as it arrives, counted."""
    counters.inc("ingest_refused_too_large")
    return ApiError(413, "body", f"over the limit of {limit} bytes")


def client_gone(counters: Counters) -> ApiError:
    """The sender went away mid-body (it keeps the batch and retries): nothing to store, nobody to
    answer (the server drops the reply instead of logging a traceback)."""
    counters.inc("ingest_client_disconnects")
    return ApiError(499, "body", "the client disconnected before sending the whole body")


async def read_body(declared: str | None, receive: Receive, limit: int, counters: Counters) -> bytes:
    """A request body of at most ``limit`` bytes (``declared``: its Content-Length header); 413
    past the limit, whatever the header said, and 499 when the sender goes away mid-body."""
    check_declared(declared, limit, counters)
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            raise client_gone(counters)
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            size += len(chunk)
            if size > limit:
                raise too_large(limit, counters)
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _settle(replied: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not replied.done():  # a request cancelled meanwhile is answered by nobody
        replied.set_result(outcome)


class IngestFirst:
    """The served ASGI app: ``POST /api/v1/ingest`` goes straight to ``ingest`` (the route behind
    its own :class:`~gpuscope.web.guard.AuthMiddleware`, which shares the rate limiter of the one
    in ``rest``), every other request, and the lifespan, to ``rest``.

    An agent's request then skips what it does not need: Starlette's error and exception
    middlewares, the settle-reads check (GETs only), the router's matching and the route's
    wrapper. What it answers and counts
    is the same (the route raises nothing it does not answer; anything else reaches uvicorn, which
    answers 500 as Starlette's error middleware would).
    """

    def __init__(self, rest: ASGIApp, ingest: ASGIApp) -> None:
        self.rest = rest
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == INGEST_PATH and scope["method"] == "POST":
            await self.ingest(scope, receive, send)
        else:
            await self.rest(scope, receive, send)


class IngestRoute:
    """The ASGI app of ``POST /api/v1/ingest`` (see the module docstring).

    Its steps are methods that the lean path (:mod:`gpuscope.web.lean_ingest`) calls too, so both
    answer and count alike: :meth:`admit` (overload), :meth:`content_type` and
    :func:`check_declared` (before the body), :meth:`take` (decode, validate, store durably,
    answer) and :meth:`refusal` (an :class:`ApiError`'s answer, counted).
    """

    def __init__(self, hub: IngestTarget, limits: Limits, clock: Callable[[], float] = time.time) -> None:
        self.hub = hub
        self.limits = limits
        self.clock = clock
        #: (first failure, message) while ingest cannot store; cleared by the next stored batch
        self.storage_error: tuple[float, str] | None = None
        # a plain executor: anyio's worker-thread hop (run_in_threadpool) costs about 35 µs of CPU
        # more per request, a few per cent of an agent's batch
        self._pool = ThreadPoolExecutor(INGEST_THREADS, thread_name_prefix="gpuscope-ingest")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            require_principal(scope)
        except ApiError as exc:
            await self.refusal(exc).send(send)
            return
        ticket = self.admit(header(scope, SENDER), header(scope, URGENT), header(scope, b"content-length"))
        if isinstance(ticket, Answer):
            await ticket.send(send)
            return
        try:
            ctype = self.content_type(header(scope, b"content-type"))
            limit = self.limits.max_body_bytes
            body = await read_body(header(scope, b"content-length"), receive, limit, self.hub.counters)
        except ApiError as exc:
            self.hub.overload.done(ticket)
            await self.refusal(exc).send(send)
            return
        except BaseException:
            self.hub.overload.done(ticket)
            raise
        replied: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        urgent = header(scope, URGENT) == URGENT_EVENTS
        self.take(ticket, ctype, body, functools.partial(_settle, replied), urgent=urgent)
        outcome = await replied
        if isinstance(outcome, Exception):
            raise outcome
        await outcome.send(send)

    def refusal(self, exc: ApiError) -> Answer:
        """The answer to a refused request, counted as ``api_refused_<status>``."""
        self.hub.counters.inc(refusal_counter(exc.status))
        return json_answer(exc.status, {"error": exc.message, "field": exc.field})

    def admit(self, sender: str | None, urgent: str | None = None, length: str | None = None) -> int | Answer:
        """The overload monitor's ticket for a request from ``sender`` (its sender header), to be
        given back with ``hub.overload.done``; or, while the hub is behind, the 503 to answer at
        once with its Retry-After. Refused before the body is read, which costs the hub next to
        nothing; not acknowledged, so the sender keeps the batch, spools, and comes back after
        Retry-After. A request marked urgent (``urgent``: its urgent header) of a declared
        Content-Length ``length`` may be admitted while behind (:mod:`gpuscope.ingest.overload`)."""
        size = int(length) if urgent == URGENT_EVENTS and length is not None and is_count(length) else None
        admission = self.hub.overload.admit(self.clock(), self._sender(sender), size)
        if admission.ticket is not None:
            return admission.ticket
        self.hub.counters.inc("ingest_shed_requests")
        doc = {"error": "the hub is behind on ingest; retry after the given delay", "field": "hub"}
        return json_answer(503, doc, [(b"retry-after", str(admission.retry_after).encode())])

    def _sender(self, raw: str | None) -> SenderKey | None:
        """Who the request says it reports for: a malformed name is counted, and the request is
        taken as one that names nobody (the header only spares the sender blame while shed)."""
        try:
            return parse_sender(raw)
        except SenderHeaderError:
            self.hub.counters.inc("ingest_sender_header_malformed")
            return None

    def content_type(self, declared: str | None) -> str:
        """The media type of a body with Content-Type ``declared`` (JSON when none): 415 unless it
        is one the route decodes."""
        ctype = ("application/json" if declared is None else declared).split(";")[0].strip()
        if ctype not in CONTENT_TYPES:
            accepted = " or ".join(CONTENT_TYPES)
            raise ApiError(415, "content-type", f"{ctype!r} is not supported; send {accepted}")
        return ctype

    def take(self, ticket: int, ctype: str, body: bytes, reply: Reply, *, urgent: bool = False) -> None:
        """Decode, validate and store durably the body of an admitted request (``ticket``, given
        back here); ``reply`` hears its answer once, on the event loop (at once for a refusal,
        once the batch is durable for an acknowledgement). ``urgent``: the request is marked
        ``X-Gpuscope-Urgent: events``, so its batch must hold urgent events only."""
        loop = asyncio.get_running_loop()
        try:
            batch = self._decode(ctype, body, urgent)

            def durable(outcome: AppendResult | Exception) -> None:  # on the store's thread, or here
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._durable, ticket, batch, outcome, reply)

            try:
                started = self.hub.ingest_then(batch, durable)
            except StoreError as exc:
                raise self._not_stored(exc) from None
        except ApiError as exc:
            self.hub.overload.done(ticket)
            reply(self.refusal(exc))
            return
        except Exception as exc:  # a fault of the hub's: the server logs it and answers 500
            self.hub.overload.done(ticket)
            reply(exc)
            return
        if not started:
            pending = loop.run_in_executor(self._pool, self._store, batch)
            pending.add_done_callback(functools.partial(self._stored_off_loop, ticket, reply))

    def _durable(self, ticket: int, batch: Batch, outcome: AppendResult | Exception, reply: Reply) -> None:
        """On the event loop: the store's word on a batch appended by :meth:`take`."""
        self.hub.overload.done(ticket)
        if isinstance(outcome, StoreError):
            reply(self.refusal(self._not_stored(outcome)))
        elif isinstance(outcome, Exception):
            reply(outcome)
        else:
            reply(self._acked(batch, outcome))

    def _stored_off_loop(self, ticket: int, reply: Reply, done: Future[Answer]) -> None:
        """On the event loop: a worker thread's :meth:`_store` of a batch finished."""
        self.hub.overload.done(ticket)
        if done.cancelled():  # the loop is closing: nobody waits for the answer
            return
        error = done.exception()
        if error is None:
            reply(done.result())
        elif isinstance(error, ApiError):
            reply(self.refusal(error))
        else:
            reply(error if isinstance(error, Exception) else RuntimeError(repr(error)))

    def _decode(self, ctype: str, body: bytes, urgent: bool = False) -> Batch:
        """The batch, decoded and validated: 400 naming the field."""
        try:
            batch = decode_body(ctype, body, self.limits)
            check_time_window(batch, self.clock(), self.limits)
        except PayloadError as exc:
            self.hub.counters.inc("ingest_rejected_batches")
            raise ApiError(400, exc.field, exc.message) from None
        if urgent:
            try:
                check_urgent(batch)
            except PayloadError as exc:
                self.hub.counters.inc("ingest_rejected_batches")
                self.hub.counters.inc("ingest_refused_urgent")
                raise ApiError(400, exc.field, exc.message) from None
        return batch

    def _store(self, batch: Batch) -> Answer:
        """Store durably (on a worker thread): the acknowledgement."""
        try:
            result = self.hub.ingest(batch)
        except StoreError as exc:
            raise self._not_stored(exc) from None
        return self._acked(batch, result)

    def _not_stored(self, exc: StoreError) -> ApiError:
        """Not acknowledged, so the sender keeps the batch and retries (5xx): 507 when the disk is
        full, 503 for any other storage failure."""
        self.hub.counters.inc("ingest_storage_failures")
        since = self.storage_error[0] if self.storage_error else self.clock()
        self.storage_error = (since, str(exc))
        status = 507 if isinstance(exc, StoreFull) else 503
        return ApiError(status, "storage", f"the batch was not stored, retry later: {exc}")

    def _acked(self, batch: Batch, result: AppendResult) -> Answer:
        """The answer to a stored batch; a cluster member names the hub owning the sender's shard
        (senders move there)."""
        self.storage_error = None
        doc = {
            "accepted": {"samples": result.samples, "events": result.events, "training": result.training},
            "refused": {"entities": result.refused_entities, "samples": result.refused_samples},
            "duplicate": result.duplicate,
            "notes": result.notes,
        }
        owner = self.hub.owner_url(batch)
        return json_answer(200, doc, [(_OWNER, owner.encode("latin-1"))] if owner else None)
