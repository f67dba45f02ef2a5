"""The hub's HTTP API: ingest batches, query series and snapshots, list alerts, health.

Handlers are thin: they authenticate, bound and validate the request, then call the
:class:`~gpuscope.hub.Hub` or its store on a worker thread (a store append waits for its group
commit, which must not block the event loop). Every refusal is a 4xx whose JSON names the field.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope import __version__
from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits, PayloadError, decode_json, parse_batch, training_to_json
from gpuscope.model import Alert, Event
from gpuscope.web.openapi import openapi_document

Handler = Callable[[Request], Awaitable[Response]]


class ApiError(Exception):
    """A refusal with its HTTP status and the name of the offending field."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


def _error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


def _json_safe(value: Any) -> Any:
    """NaN/Inf are not JSON; missing values travel as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _float_param(request: Request, name: str, default: float | None = None) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, name, f"query parameter {name!r} is required")
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, name, f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ApiError(400, name, "must be finite")
    return value


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise ApiError(400, name, f"must be an integer in {lo}..{hi}")
    return int(raw)


def _str_param(request: Request, name: str, required: bool = True) -> str | None:
    raw = request.query_params.get(name)
    if raw is None and required:
        raise ApiError(400, name, f"query parameter {name!r} is required")
    if raw is not None and not 0 < len(raw) <= 256:
        raise ApiError(400, name, "must be 1 to 256 characters")
    return raw


def _alert_json(alert: Alert) -> dict[str, Any]:
    return _json_safe(alert.to_dict())  # type: ignore[no-any-return]


def _event_json(event: Event) -> dict[str, Any]:
    return {"ts": event.ts, "kind": event.kind, "labels": event.labels, "data": _json_safe(event.data)}


class HubApi:
    """Builds the Starlette app around a hub; ``tokens`` guard every write."""

    def __init__(
        self,
        hub: Hub,
        *,
        tokens: list[str] | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hub = hub
        self.limits = limits or Limits()
        self.clock = clock
        self.started = clock()
        self._token_digests = [hashlib.sha256(t.encode()).digest() for t in tokens or []]
        routes = [
            Route("/api/v1/ingest", self._guard(self.ingest), methods=["POST"]),
            Route("/api/v1/series", self._guard(self.series), methods=["GET"]),
            Route("/api/v1/snapshot", self._guard(self.snapshot), methods=["GET"]),
            Route("/api/v1/aggregate", self._guard(self.aggregate), methods=["GET"]),
            Route("/api/v1/events", self._guard(self.events), methods=["GET"]),
            Route("/api/v1/training", self._guard(self.training), methods=["GET"]),
            Route("/api/v1/alerts", self._guard(self.alerts), methods=["GET"]),
            Route("/api/v1/incidents", self._guard(self.incidents), methods=["GET"]),
            Route("/api/v1/health", self._guard(self.health), methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]
        from gpuscope.alert.http import AlertingApi  # imports this module: only once it is loaded

        alerting = AlertingApi(hub, self._authorize_write)
        routes += [Route(path, self._guard(h), methods=m) for path, h, m in alerting.routes()]
        from gpuscope.lineage import for_hub
        from gpuscope.web.dashboard_api import dashboard_routes
        from gpuscope.web.lineage_api import LineageApi

        routes += LineageApi(for_hub(hub), self._authorize_write).routes()

        self.app = Starlette(routes=[*routes, *dashboard_routes(hub)])

    # -- plumbing -----------------------------------------------------------------------------

    def _guard(self, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                self.hub.counters.inc(f"api_refused_{exc.status}")
                return _error(exc.status, exc.field, exc.message)

        return wrapped

    def _authorize_write(self, request: Request) -> None:
        if not self._token_digests:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "authorization", "a bearer token is required to write")
        digest = hashlib.sha256(token.strip().encode()).digest()
        if not any(hmac.compare_digest(digest, known) for known in self._token_digests):
            raise ApiError(403, "authorization", "the token is not valid")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ApiError(400, "content-length", "must be an integer")
            if int(declared) > limit:
                self.hub.counters.inc("ingest_refused_too_large")
                raise ApiError(413, "body", f"{declared} bytes is over the limit of {limit}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                self.hub.counters.inc("ingest_refused_too_large")
                raise ApiError(413, "body", f"over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    # -- handlers -----------------------------------------------------------------------------

    async def ingest(self, request: Request) -> Response:
        self._authorize_write(request)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        if ctype != "application/json":
            raise ApiError(415, "content-type", f"{ctype!r} is not supported; send application/json")
        body = await self._read_body(request)

        def work() -> dict[str, Any]:
            try:
                batch = parse_batch(decode_json(body, self.limits), self.limits)
            except PayloadError as exc:
                self.hub.counters.inc("ingest_rejected_batches")
                raise ApiError(400, exc.field, exc.message) from None
            result = self.hub.ingest(batch)
            return {
                "accepted": {"samples": result.samples, "events": result.events, "training": result.training},
                "refused": {"entities": result.refused_entities, "samples": result.refused_samples},
                "duplicate": result.duplicate,
                "notes": result.notes,
            }

        return JSONResponse(await run_in_threadpool(work))

    async def series(self, request: Request) -> Response:
        metric = _str_param(request, "metric")
        assert metric is not None
        now = self.clock()
        end = _float_param(request, "end", now)
        start = _float_param(request, "start", end - 3600)
        if start > end:
            raise ApiError(400, "start", "must not be after end")
        points = _int_param(request, "points", 300, 1, 10_000)
        labels = {
            k: v for k, v in request.query_params.items() if k not in {"metric", "start", "end", "points"}
        }
        rows = await run_in_threadpool(self.hub.store.series, metric, labels, start, end, points)
        return JSONResponse(
            {"metric": metric, "labels": labels, "points": [[p.ts, _json_safe(p.value)] for p in rows]}
        )

    async def snapshot(self, request: Request) -> Response:
        raw = _str_param(request, "metrics", required=False)
        metrics = [m for m in raw.split(",") if m] if raw else None
        max_age = _float_param(request, "max_age", -1.0)
        rows = await run_in_threadpool(self.hub.store.snapshot, metrics, max_age if max_age >= 0 else None)
        return JSONResponse({"entities": _json_safe(rows)})

    async def aggregate(self, request: Request) -> Response:
        metric = _str_param(request, "metric")
        by = _str_param(request, "by")
        assert metric is not None and by is not None
        now = self.clock()
        end = _float_param(request, "end", now)
        start = _float_param(request, "start", end - 3600)
        rows = await run_in_threadpool(self.hub.store.aggregate, metric, by, start, end)
        return JSONResponse({"metric": metric, "by": by, "groups": _json_safe(rows)})

    async def events(self, request: Request) -> Response:
        now = self.clock()
        end = _float_param(request, "end", now)
        start = _float_param(request, "start", end - 3600)
        kind = _str_param(request, "kind", required=False)
        limit = _int_param(request, "limit", 1000, 1, 100_000)
        labels = {k: v for k, v in request.query_params.items() if k not in {"start", "end", "kind", "limit"}}
        rows = await run_in_threadpool(self.hub.store.events, start, end, kind, labels or None, limit)
        return JSONResponse({"events": [_event_json(e) for e in rows]})

    async def training(self, request: Request) -> Response:
        job = _str_param(request, "job")
        assert job is not None
        now = self.clock()
        end = _float_param(request, "end", now)
        start = _float_param(request, "start", end - 3600)
        rank_raw = request.query_params.get("rank")
        if rank_raw is not None and not rank_raw.isdigit():
            raise ApiError(400, "rank", "must be a non-negative integer")
        rank = int(rank_raw) if rank_raw is not None else None
        limit = _int_param(request, "limit", 10_000, 1, 1_000_000)
        rows = await run_in_threadpool(self.hub.store.training, job, start, end, rank, limit)
        return JSONResponse({"job": job, "records": [training_to_json(r) for r in rows]})

    async def alerts(self, request: Request) -> Response:
        state = request.query_params.get("state", "firing")
        if state not in {"firing", "all"}:
            raise ApiError(400, "state", "must be 'firing' or 'all'")
        limit = _int_param(request, "limit", 1000, 1, 100_000)
        rows = await run_in_threadpool(self.hub.store.alerts, state == "firing", limit)
        return JSONResponse({"alerts": [_alert_json(a) for a in rows]})

    async def incidents(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.hub.incidents)
        return JSONResponse({"incidents": _json_safe(rows)})

    async def health(self, request: Request) -> Response:
        stats = await run_in_threadpool(self.hub.store.stats)
        return JSONResponse(
            _json_safe(
                {
                    "status": "ok",
                    "version": __version__,
                    "uptime_seconds": self.clock() - self.started,
                    "counters": self.hub.counters.snapshot(),
                    "detection": self.hub.detection_stats(),
                    "store": stats,
                    "firing_alerts": len(self.hub.firing()),
                }
            )
        )

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(__version__))
