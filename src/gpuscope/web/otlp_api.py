"""``POST /v1/metrics`` and ``POST /v1/traces``: OpenTelemetry's OTLP/HTTP exports, as a collector
would take them.

Point an OTLP exporter at ``http://HUB:7470`` (``OTEL_EXPORTER_OTLP_ENDPOINT``; the exporters add
``/v1/metrics`` and ``/v1/traces``) with an ``ingest`` token as ``Authorization: Bearer ...``.
Protobuf and JSON bodies, gzip or not. The mappings onto gpuscope's inference signals are
:mod:`gpuscope.ingest.otlp` and :mod:`gpuscope.ingest.otlp_traces`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.hub import Hub
from gpuscope.ingest import otlp, otlp_traces
from gpuscope.ingest.payload import Limits, PayloadError, check_time_window
from gpuscope.model import Batch
from gpuscope.store.errors import StoreError

PROTOBUF = "application/x-protobuf"
Handler = Callable[[Request], Awaitable[Response]]
# body, content type, content encoding -> (batch, points or spans not used, the protobuf answer)
Convert = Callable[[bytes, str, str], tuple[Batch, int, bytes]]


class OtlpApi:
    def __init__(
        self,
        hub: Hub,
        read_body: Callable[[Request], Awaitable[bytes]],
        authorize_write: Callable[[Request], None],
        limits: Limits,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hub = hub
        self.read_body = read_body
        self.authorize_write = authorize_write
        self.limits = limits
        self.clock = clock
        self.receiver = otlp.OtlpReceiver(hub.counters)

    def routes(self, guard: Callable[[Handler], Handler]) -> list[Route]:
        return [
            Route(otlp.PATH, guard(self._endpoint(self._metrics)), methods=["POST"]),
            Route(otlp_traces.PATH, guard(self._endpoint(self._traces)), methods=["POST"]),
        ]

    def _metrics(self, body: bytes, ctype: str, encoding: str) -> tuple[Batch, int, bytes]:
        export = self.receiver.decode(body, ctype, encoding, self.limits.max_body_bytes)
        batch, rejected = self.receiver.to_batch(export)
        return batch, rejected, otlp.response(rejected)

    def _traces(self, body: bytes, ctype: str, encoding: str) -> tuple[Batch, int, bytes]:
        export = otlp_traces.decode(body, ctype, encoding, self.limits.max_body_bytes)
        batch, rejected = otlp_traces.to_batch(export)
        self.hub.counters.inc("otlp_spans_rejected", rejected)
        return batch, rejected, otlp_traces.response(rejected)

    def _endpoint(self, convert: Convert) -> Handler:
        async def handle(request: Request) -> Response:
            self.authorize_write(request)
            body = await self.read_body(request)
            ctype = request.headers.get("content-type", PROTOBUF)
            encoding = request.headers.get("content-encoding", "")

            def work() -> Response:
                try:
                    batch, _, answer = convert(body, ctype, encoding)
                    check_time_window(batch, self.clock(), self.limits)  # as /api/v1/ingest does
                except otlp.OtlpError as exc:
                    self.hub.counters.inc("otlp_refused_exports")
                    return JSONResponse({"error": str(exc), "field": "body"}, status_code=400)
                except PayloadError as exc:
                    self.hub.counters.inc("otlp_refused_exports")
                    return JSONResponse({"error": exc.message, "field": exc.field}, status_code=400)
                if batch.frames:
                    try:
                        self.hub.ingest(batch)
                    except StoreError as exc:  # 503: the exporter retries the export
                        self.hub.counters.inc("ingest_storage_failures")
                        error = {"error": f"not stored, retry later: {exc}", "field": "storage"}
                        return JSONResponse(error, status_code=503)
                return Response(answer, media_type=PROTOBUF)

            return await run_in_threadpool(work)

        return handle
