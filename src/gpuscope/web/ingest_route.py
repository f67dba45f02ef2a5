"""``POST /api/v1/ingest``: an agent's, an SDK's or a relay's batch, stored durably before the answer.

Every node posts here once a second, so this route is a plain ASGI app rather than a Starlette
handler: it reads the two or three headers it needs from the raw header list, the body straight
from ``receive``, and answers with orjson, without a ``Request``, a ``JSONResponse`` or Starlette's
per-request exception wrapper. It still sits behind the same front door as every route
(:class:`~gpuscope.web.guard.AuthMiddleware`: token, scope, rate limit), and what it answers is what
the handlers answer: a refusal is ``{"error": ..., "field": ...}`` with its status, counted as
``api_refused_<status>``.

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
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope.agent.route import OWNER_HEADER
from gpuscope.counters import Counters
from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPES, decode_body
from gpuscope.ingest.overload import SENDER_HEADER, SenderHeaderError, SenderKey, parse_sender
from gpuscope.ingest.payload import Limits, PayloadError, check_time_window
from gpuscope.model import Batch
from gpuscope.store.base import AppendResult
from gpuscope.store.errors import StoreError, StoreFull
from gpuscope.web.errors import ApiError, refusal_counter
from gpuscope.web.guard import require_principal

#: worker threads for ingest requests to stores that cannot start an append (remote stores: each
#: append waits for its round trips)
INGEST_THREADS = 32
INGEST_PATH = "/api/v1/ingest"
RawHeaders = list[tuple[bytes, bytes]]

_SENDER = SENDER_HEADER.lower().encode("latin-1")
_OWNER = OWNER_HEADER.lower().encode("latin-1")
_JSON = (b"content-type", b"application/json")


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case, as ASGI servers pass names), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value, "latin-1")
    return None


def is_count(raw: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes '²', which ``int`` refuses."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 18


async def read_body(declared: str | None, receive: Receive, limit: int, counters: Counters) -> bytes:
    """A request body of at most ``limit`` bytes (``declared``: its Content-Length header); 413
    past the limit, whatever the header said, and 499 when the sender goes away mid-body."""
    if declared is not None:
        if not is_count(declared):
            raise ApiError(400, "content-length", "must be an integer")
        if int(declared) > limit:
            counters.inc("ingest_refused_too_large")
            raise ApiError(413, "body", f"{declared} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            # The sender went away mid-body (it keeps the batch and retries): nothing to store,
            # nobody to answer; uvicorn drops the reply instead of logging a traceback.
            counters.inc("ingest_client_disconnects")
            raise ApiError(499, "body", "the client disconnected before sending the whole body")
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            size += len(chunk)
            if size > limit:
                counters.inc("ingest_refused_too_large")
                raise ApiError(413, "body", f"over the limit of {limit} bytes")
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def answer(send: Send, status: int, doc: dict[str, Any], headers: RawHeaders | None = None) -> None:
    """A JSON answer, with the headers a Starlette ``JSONResponse`` would send."""
    body = orjson.dumps(doc)
    raw = [*(headers or ()), (b"content-length", str(len(body)).encode("latin-1")), _JSON]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _settle(stored: asyncio.Future[AppendResult | Exception], outcome: AppendResult | Exception) -> None:
    if not stored.done():  # a request cancelled meanwhile is answered by nobody
        stored.set_result(outcome)


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
    """The ASGI app of ``POST /api/v1/ingest`` (see the module docstring)."""

    def __init__(self, hub: Hub, limits: Limits, clock: Callable[[], float] = time.time) -> None:
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
            admission = self.hub.overload.admit(self.clock(), self._sender(scope))
            if admission.ticket is None:
                # behind: refused before reading the body, which costs the hub next to nothing;
                # not acknowledged, so the sender keeps the batch, spools, and comes back after
                # Retry-After
                self.hub.counters.inc("ingest_shed_requests")
                doc = {"error": "the hub is behind on ingest; retry after the given delay", "field": "hub"}
                await answer(send, 503, doc, [(b"retry-after", str(admission.retry_after).encode())])
                return
            try:
                doc, owner = await self._ingest(scope, receive)
            finally:
                self.hub.overload.done(admission.ticket)
        except ApiError as exc:
            self.hub.counters.inc(refusal_counter(exc.status))
            await answer(send, exc.status, {"error": exc.message, "field": exc.field})
            return
        # a cluster member names the hub owning the sender's shard: senders move there
        await answer(send, 200, doc, [(_OWNER, owner.encode("latin-1"))] if owner else None)

    def _sender(self, scope: Scope) -> SenderKey | None:
        """Who the request says it reports for: a malformed name is counted, and the request is
        taken as one that names nobody (the header only spares the sender blame while shed)."""
        try:
            return parse_sender(header(scope, _SENDER))
        except SenderHeaderError:
            self.hub.counters.inc("ingest_sender_header_malformed")
            return None

    async def _ingest(self, scope: Scope, receive: Receive) -> tuple[dict[str, Any], str | None]:
        declared_type = header(scope, b"content-type")
        ctype = ("application/json" if declared_type is None else declared_type).split(";")[0].strip()
        if ctype not in CONTENT_TYPES:
            accepted = " or ".join(CONTENT_TYPES)
            raise ApiError(415, "content-type", f"{ctype!r} is not supported; send {accepted}")
        limit = self.limits.max_body_bytes
        body = await read_body(header(scope, b"content-length"), receive, limit, self.hub.counters)
        batch = self._decode(ctype, body)
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[AppendResult | Exception] = loop.create_future()

        def durable(outcome: AppendResult | Exception) -> None:  # on the store's thread, or here
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, stored, outcome)

        try:
            started = self.hub.ingest_then(batch, durable)
        except StoreError as exc:
            raise self._not_stored(exc) from None
        if not started:
            return await loop.run_in_executor(self._pool, self._store, batch)
        outcome = await stored
        if isinstance(outcome, StoreError):
            raise self._not_stored(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return self._stored(batch, outcome)

    def _decode(self, ctype: str, body: bytes) -> Batch:
        """The batch, decoded and validated: 400 naming the field."""
        try:
            batch = decode_body(ctype, body, self.limits)
            check_time_window(batch, self.clock(), self.limits)
        except PayloadError as exc:
            self.hub.counters.inc("ingest_rejected_batches")
            raise ApiError(400, exc.field, exc.message) from None
        return batch

    def _store(self, batch: Batch) -> tuple[dict[str, Any], str | None]:
        """Store durably (on a worker thread): the answer and the shard owner."""
        try:
            result = self.hub.ingest(batch)
        except StoreError as exc:
            raise self._not_stored(exc) from None
        return self._stored(batch, result)

    def _not_stored(self, exc: StoreError) -> ApiError:
        """Not acknowledged, so the sender keeps the batch and retries (5xx): 507 when the disk is
        full, 503 for any other storage failure."""
        self.hub.counters.inc("ingest_storage_failures")
        since = self.storage_error[0] if self.storage_error else self.clock()
        self.storage_error = (since, str(exc))
        status = 507 if isinstance(exc, StoreFull) else 503
        return ApiError(status, "storage", f"the batch was not stored, retry later: {exc}")

    def _stored(self, batch: Batch, result: AppendResult) -> tuple[dict[str, Any], str | None]:
        """The answer to a stored batch, and the hub owning its sender's shard."""
        self.storage_error = None
        return {
            "accepted": {"samples": result.samples, "events": result.events, "training": result.training},
            "refused": {"entities": result.refused_entities, "samples": result.refused_samples},
            "duplicate": result.duplicate,
            "notes": result.notes,
        }, self.hub.placement.owner_url(batch)
