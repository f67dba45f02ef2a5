"""The hub's HTTP API: ingest batches, query series and snapshots, list alerts, health.

Handlers are thin: they authenticate, bound and validate the request, then call the
:class:`~gpuscope.hub.Hub` or its store on a worker thread (a store append waits for its group
commit, which must not block the event loop). Every refusal is a 4xx whose JSON names the field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope import __version__
from gpuscope.hub import Hub
from gpuscope.ingest.payload import (
    LABEL_KEY_RE,
    MAX_TIMESTAMP,
    Limits,
    PayloadError,
    check_time_window,
    decode_json,
    parse_batch,
    training_to_json,
)
from gpuscope.model import Alert, Event
from gpuscope.store.errors import StoreError, StoreFull
from gpuscope.web.auth import AuditLog, AuthSettings
from gpuscope.web.guard import PRINCIPAL_KEY, AuthMiddleware
from gpuscope.web.openapi import openapi_document
from gpuscope.web.productivity_api import ProductivityApi

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


def _is_count(raw: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes '²', which ``int`` refuses."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 18


def _time_range(request: Request, now: float) -> tuple[float, float]:
    """``start``/``end`` (default: the hour before now), within the timestamps a batch may carry."""
    end = _float_param(request, "end", now)
    start = _float_param(request, "start", end - 3600)
    for name, value in (("start", start), ("end", end)):
        if abs(value) > MAX_TIMESTAMP:
            raise ApiError(400, name, f"must be seconds since the epoch, within ±{MAX_TIMESTAMP:.0f}")
    if start > end:
        raise ApiError(400, "start", "must not be after end")
    return start, end


def _label_params(request: Request, reserved: set[str]) -> dict[str, str]:
    """Query parameters other than ``reserved`` are label matchers; their names must be label names."""
    labels = {k: v for k, v in request.query_params.items() if k not in reserved}
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key):
            raise ApiError(400, key or "query", f"{key!r} is neither a parameter nor a label name")
        if len(value) > 256:
            raise ApiError(400, key, "a label value is at most 256 characters")
    return labels


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _is_count(raw) or not lo <= int(raw) <= hi:
        raise ApiError(400, name, f"must be an integer in {lo}..{hi}")
    return int(raw)


def _str_param(request: Request, name: str, required: bool = True) -> str | None:
    raw = request.query_params.get(name)
    if raw is None and required:
        raise ApiError(400, name, f"query parameter {name!r} is required")
    if raw is not None and not 0 < len(raw) <= 256:
        raise ApiError(400, name, "must be 1 to 256 characters")
    return raw


async def _no_route(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer JSON naming what was wrong, like every other refusal."""
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return _error(405, "method", f"{request.method} is not allowed on {request.url.path}")
    return _error(404, "path", f"no such endpoint: {request.url.path}")


def _alert_json(alert: Alert) -> dict[str, Any]:
    return _json_safe(alert.to_dict())  # type: ignore[no-any-return]


def _event_json(event: Event) -> dict[str, Any]:
    return {"ts": event.ts, "kind": event.kind, "labels": event.labels, "data": _json_safe(event.data)}


class HubApi:
    """Builds the Starlette app around a hub, behind :class:`~gpuscope.web.guard.AuthMiddleware`.

    ``auth`` holds the scoped tokens (or ``tokens``: plain ones with every scope); ``open_reads``
    lets reads through without a token (a loopback listener).
    """

    def __init__(
        self,
        hub: Hub,
        *,
        tokens: list[str] | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        auth: AuthSettings | None = None,
        open_reads: bool = True,
        audit: AuditLog | None = None,
    ) -> None:
        self.hub = hub
        self.limits = limits or Limits()
        self.clock = clock
        self.started = clock()
        #: (first failure, message) while ingest cannot store; cleared by the next stored batch
        self.storage_error: tuple[float, str] | None = None
        self.auth = auth if auth is not None else AuthSettings.from_plain(tokens or [])
        self.audit = audit if audit is not None else AuditLog(self.auth.audit_log)
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
            Route("/api/v1/audit", self._guard(self.audit_log), methods=["GET"]),
        ]
        from gpuscope.alert.http import AlertingApi  # imports this module: only once it is loaded

        alerting = AlertingApi(hub, self._authorize_write)
        routes += [Route(path, self._guard(h), methods=m) for path, h, m in alerting.routes()]
        from gpuscope.lineage import for_hub
        from gpuscope.web.dashboard_api import dashboard_routes
        from gpuscope.web.lineage_api import LineageApi

        routes += LineageApi(for_hub(hub), self._authorize_write).routes()
        routes += ProductivityApi(hub, clock).routes()
        from gpuscope.cluster.http import cluster_routes

        routes += cluster_routes(hub, self._guard, self.limits)  # none unless the hub is a cluster member

        self.app = Starlette(
            routes=[*routes, *dashboard_routes(hub)],
            exception_handlers={404: _no_route, 405: _no_route},
        )
        self.app.add_middleware(
            AuthMiddleware,
            settings=self.auth,
            routes=lambda: self.app.routes,
            open_reads=open_reads,
            counters=hub.counters,
            audit=self.audit,
        )

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
        """The middleware authorised the request for its route's scope; a handler reached any
        other way (mounted outside it) refuses rather than writing unauthenticated."""
        if PRINCIPAL_KEY not in request.scope:
            raise ApiError(401, "authorization", "this request was not authenticated")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not _is_count(declared):
                raise ApiError(400, "content-length", "must be an integer")
            if int(declared) > limit:
                self.hub.counters.inc("ingest_refused_too_large")
                raise ApiError(413, "body", f"{declared} bytes is over the limit of {limit}")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    self.hub.counters.inc("ingest_refused_too_large")
                    raise ApiError(413, "body", f"over the limit of {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            # The sender went away mid-body (it keeps the batch and retries): nothing to store,
            # nobody to answer; uvicorn drops the reply instead of logging a traceback.
            self.hub.counters.inc("ingest_client_disconnects")
            raise ApiError(499, "body", "the client disconnected before sending the whole body") from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

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
                check_time_window(batch, self.clock(), self.limits)
            except PayloadError as exc:
                self.hub.counters.inc("ingest_rejected_batches")
                raise ApiError(400, exc.field, exc.message) from None
            try:
                result = self.hub.ingest(batch)
            except StoreError as exc:
                # Not acknowledged, so the sender keeps the batch and retries (5xx): 507 when the
                # disk is full, 503 for any other storage failure.
                self.hub.counters.inc("ingest_storage_failures")
                since = self.storage_error[0] if self.storage_error else self.clock()
                self.storage_error = (since, str(exc))
                status = 507 if isinstance(exc, StoreFull) else 503
                raise ApiError(status, "storage", f"the batch was not stored, retry later: {exc}") from None
            self.storage_error = None
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
        start, end = _time_range(request, self.clock())
        points = _int_param(request, "points", 300, 1, 10_000)
        labels = _label_params(request, {"metric", "start", "end", "points"})
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
        start, end = _time_range(request, self.clock())
        rows = await run_in_threadpool(self.hub.store.aggregate, metric, by, start, end)
        return JSONResponse({"metric": metric, "by": by, "groups": _json_safe(rows)})

    async def events(self, request: Request) -> Response:
        start, end = _time_range(request, self.clock())
        kind = _str_param(request, "kind", required=False)
        limit = _int_param(request, "limit", 1000, 1, 100_000)
        labels = _label_params(request, {"start", "end", "kind", "limit"})
        rows = await run_in_threadpool(self.hub.store.events, start, end, kind, labels or None, limit)
        return JSONResponse({"events": [_event_json(e) for e in rows]})

    async def training(self, request: Request) -> Response:
        job = _str_param(request, "job")
        assert job is not None
        start, end = _time_range(request, self.clock())
        rank_raw = request.query_params.get("rank")
        if rank_raw is not None and not _is_count(rank_raw):
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
        from gpuscope.cluster.http import cluster_health

        stats = await run_in_threadpool(self.hub.store.stats)
        failing = self.storage_error
        return JSONResponse(
            _json_safe(
                {
                    "status": "ok" if failing is None else "degraded",
                    "storage": {
                        "ok": failing is None,
                        "failing_since": failing[0] if failing else None,
                        "error": failing[1] if failing else None,
                    },
                    "version": __version__,
                    "uptime_seconds": self.clock() - self.started,
                    "counters": self.hub.counters.snapshot(),
                    "detection": self.hub.detection_stats(),
                    "store": stats,
                    "firing_alerts": len(self.hub.firing()),
                    **cluster_health(self.hub),
                }
            )
        )

    async def audit_log(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 1000, 1, 10_000)
        since = _float_param(request, "since", 0.0)
        rows = await run_in_threadpool(self.audit.entries, limit, since)
        return JSONResponse({"entries": rows})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(__version__))
