"""The hub's HTTP API: ingest batches, query series and snapshots, list alerts, health.

Handlers are thin: they authenticate, bound and validate the request, then call the
:class:`~gpuscope.hub.Hub` or its store on a worker thread (a store append waits for its group
commit, which must not block the event loop). Every refusal is a 4xx whose JSON names the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope import __version__
from gpuscope.alert.service import AlertingService
from gpuscope.cluster.member import ClusterMember
from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits, training_to_json
from gpuscope.lineage import LineageRegistry, for_hub
from gpuscope.model import LABEL_KEY_RE, MAX_TIMESTAMP, Alert, Event
from gpuscope.web.alerting_api import AlertingApi
from gpuscope.web.auth import AuditLog, AuthSettings, RateLimiter
from gpuscope.web.cluster_api import cluster_health, cluster_routes
from gpuscope.web.dashboard_api import dashboard_routes
from gpuscope.web.errors import ApiError, error_response, json_safe, refusal_counter
from gpuscope.web.guard import AuthMiddleware, require_principal
from gpuscope.web.ingest_route import INGEST_PATH, IngestFirst, IngestRoute, is_count, read_body
from gpuscope.web.lean_ingest import LeanIngest
from gpuscope.web.lineage_api import LineageApi
from gpuscope.web.openapi import openapi_document
from gpuscope.web.otlp_api import OtlpApi
from gpuscope.web.productivity_api import ProductivityApi
from gpuscope.web.prom_api import PrometheusApi
from gpuscope.web.selfmetrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gpuscope.web.selfmetrics import IngestLag
from gpuscope.web.selfmetrics import render as render_metrics
from gpuscope.web.settle import SettleReads

Handler = Callable[[Request], Awaitable[Response]]
LOOP_PROBE_S = 0.25


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
    if not is_count(raw) or not lo <= int(raw) <= hi:
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
        return error_response(405, "method", f"{request.method} is not allowed on {request.url.path}")
    return error_response(404, "path", f"no such endpoint: {request.url.path}")


def _alert_json(alert: Alert) -> dict[str, Any]:
    return json_safe(alert.to_dict())  # type: ignore[no-any-return]


def _event_json(event: Event) -> dict[str, Any]:
    return {"ts": event.ts, "kind": event.kind, "labels": event.labels, "data": json_safe(event.data)}


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
        alerting: AlertingService | None = None,
        lineage: LineageRegistry | None = None,
        cluster: ClusterMember | None = None,
    ) -> None:
        self.hub = hub
        self.alerting = alerting
        self.cluster = cluster  # the hub's cluster backends, when it is a member of one
        self.limits = limits or Limits()
        self.clock = clock
        self.started = clock()
        self.auth = auth if auth is not None else AuthSettings.from_plain(tokens or [])
        self.audit = audit if audit is not None else AuditLog(self.auth.audit_log)
        self.ingest_lag = IngestLag(clock)
        #: called with the server's event loop once it runs (a hub with ingest workers adopts the
        #: connections they hand over on it)
        self.on_loop: list[Callable[[asyncio.AbstractEventLoop], None]] = []
        self.ingest = IngestRoute(hub, self.limits, clock)
        hub.add_observer(self.ingest_lag.observe)
        routes = [
            Route(INGEST_PATH, self.ingest, methods=["POST"]),
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
            Route("/metrics", self._guard(self.metrics), methods=["GET"]),
        ]
        routes += PrometheusApi(hub, clock).routes(self._guard)  # under /prometheus: see prom_api
        routes += OtlpApi(hub, self._read_body, self._authorize_write, self.limits, clock).routes(self._guard)
        self.outbox_stats = alerting.outbox.stats if alerting is not None else None
        self.triage_stats = alerting.triage_stats if alerting is not None else None
        alerting_api = AlertingApi(hub, alerting, self._authorize_write)
        routes += [Route(path, self._guard(h), methods=m) for path, h, m in alerting_api.routes()]
        routes += LineageApi(lineage or for_hub(hub), self._authorize_write).routes()
        routes += cluster_routes(cluster, self._guard, self.limits)  # none unless a cluster member
        routes += ProductivityApi(hub, alerting, clock).routes()

        self.app = Starlette(
            routes=[*routes, *dashboard_routes(hub, alerting=alerting is not None)],
            exception_handlers={404: _no_route, 405: _no_route},
            lifespan=self._lifespan,
        )
        self.app.add_middleware(SettleReads, hub=hub)  # inside the auth check: authorised reads only
        front_door = functools.partial(
            AuthMiddleware,
            settings=self.auth,
            routes=lambda: self.app.routes,
            open_reads=open_reads,
            counters=hub.counters,
            audit=self.audit,
            limiter=RateLimiter(self.auth),
        )
        self.app.add_middleware(front_door)
        # the ingest route behind the same front door (its rate limits shared), dispatched before
        # the rest of the app in what the server serves
        guarded_ingest = front_door(self.ingest)
        #: what a server serves: ``app`` with agents' batches dispatched first
        #: (:class:`~gpuscope.web.ingest_route.IngestFirst`)
        self.asgi = IngestFirst(self.app, guarded_ingest)
        #: the same route and front door for a server serving ingest from its HTTP parser
        #: (:mod:`gpuscope.web.lean_ingest`)
        self.lean = LeanIngest(self.ingest, guarded_ingest)

    # -- plumbing -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        for ready in self.on_loop:
            ready(loop)
        watcher = asyncio.create_task(self._watch_loop())
        try:
            yield
        finally:
            watcher.cancel()

    async def _watch_loop(self) -> None:
        """How late the event loop runs a timer: requests queue for it before they can be admitted."""
        while True:
            started = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S)
            now = self.clock()
            lag = max(0.0, time.monotonic() - started - LOOP_PROBE_S)
            self.hub.overload.loop_lag(now, lag, next_due=now + LOOP_PROBE_S)

    def _guard(self, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                self.hub.counters.inc(refusal_counter(exc.status))
                return error_response(exc.status, exc.field, exc.message)

        return wrapped

    def _authorize_write(self, request: Request) -> None:
        require_principal(request.scope)

    @property
    def storage_error(self) -> tuple[float, str] | None:
        """(first failure, message) while ingest cannot store; None once a batch is stored again."""
        return self.ingest.storage_error

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        return await read_body(declared, request.receive, self.limits.max_body_bytes, self.hub.counters)

    # -- handlers -----------------------------------------------------------------------------

    async def series(self, request: Request) -> Response:
        metric = _str_param(request, "metric")
        assert metric is not None
        start, end = _time_range(request, self.clock())
        points = _int_param(request, "points", 300, 1, 10_000)
        labels = _label_params(request, {"metric", "start", "end", "points"})
        rows = await run_in_threadpool(self.hub.store.series, metric, labels, start, end, points)
        return JSONResponse(
            {"metric": metric, "labels": labels, "points": [[p.ts, json_safe(p.value)] for p in rows]}
        )

    async def snapshot(self, request: Request) -> Response:
        raw = _str_param(request, "metrics", required=False)
        metrics = [m for m in raw.split(",") if m] if raw else None
        max_age = _float_param(request, "max_age", -1.0)
        rows = await run_in_threadpool(self.hub.store.snapshot, metrics, max_age if max_age >= 0 else None)
        return JSONResponse({"entities": json_safe(rows)})

    async def aggregate(self, request: Request) -> Response:
        metric = _str_param(request, "metric")
        by = _str_param(request, "by")
        assert metric is not None and by is not None
        start, end = _time_range(request, self.clock())
        rows = await run_in_threadpool(self.hub.store.aggregate, metric, by, start, end)
        return JSONResponse({"metric": metric, "by": by, "groups": json_safe(rows)})

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
        if rank_raw is not None and not is_count(rank_raw):
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
        rows = await run_in_threadpool(self.hub.stored_alerts, state == "firing", limit)
        return JSONResponse({"alerts": [_alert_json(a) for a in rows]})

    async def incidents(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.hub.incidents)
        return JSONResponse({"incidents": json_safe(rows)})

    async def health(self, request: Request) -> Response:
        stats = await run_in_threadpool(self.hub.store.stats)
        failing = self.storage_error
        return JSONResponse(
            json_safe(
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
                    "overload": self.hub.overload.status(self.clock()),
                    **cluster_health(self.cluster),
                }
            )
        )

    async def metrics(self, request: Request) -> Response:
        """The hub's own metrics for Prometheus (ingest, refusals, lag, detection cost, outbox)."""
        uptime = self.clock() - self.started
        text = await run_in_threadpool(
            render_metrics,
            self.hub,
            self.ingest_lag,
            uptime,
            self.storage_error is None,
            self.outbox_stats,
            self.triage_stats,
        )
        return Response(text, headers={"content-type": METRICS_CONTENT_TYPE})

    async def audit_log(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 1000, 1, 10_000)
        since = _float_param(request, "since", 0.0)
        rows = await run_in_threadpool(self.audit.entries, limit, since)
        return JSONResponse({"entries": rows})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(__version__))
