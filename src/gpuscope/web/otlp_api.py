"""``POST /v1/metrics``: OpenTelemetry's OTLP/HTTP metrics export, as a collector would take it.

Point an OTLP exporter at ``http://HUB:7470/v1/metrics`` (``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``)
with an ``ingest`` token as ``Authorization: Bearer ...``. Protobuf and JSON bodies, gzip or not.
The mapping onto gpuscope's inference signals is :mod:`gpuscope.ingest.otlp`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.hub import Hub
from gpuscope.ingest.otlp import PATH, OtlpError, OtlpReceiver, response
from gpuscope.ingest.payload import Limits, PayloadError, check_time_window
from gpuscope.store.errors import StoreError

PROTOBUF = "application/x-protobuf"


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
        self.receiver = OtlpReceiver(hub.counters)

    def routes(
        self,
        guard: Callable[[Callable[[Request], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]],
    ) -> list[Route]:
        return [Route(PATH, guard(self.metrics), methods=["POST"])]

    async def metrics(self, request: Request) -> Response:
        self.authorize_write(request)
        body = await self.read_body(request)
        ctype = request.headers.get("content-type", PROTOBUF)
        encoding = request.headers.get("content-encoding", "")

        def work() -> Response:
            try:
                export = self.receiver.decode(body, ctype, encoding, self.limits.max_body_bytes)
                batch, rejected = self.receiver.to_batch(export)
                check_time_window(batch, self.clock(), self.limits)  # as /api/v1/ingest does
            except OtlpError as exc:
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
                    return JSONResponse({"error": f"not stored, retry later: {exc}", "field": "storage"}, 503)
            return Response(response(rejected), media_type=PROTOBUF)

        return await run_in_threadpool(work)
