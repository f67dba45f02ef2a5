"""Serves the web dashboard: the single-page app under ``/ui/`` and the JSON each page reads.

The page endpoints (``/api/v1/ui/...``) are reads, unauthenticated like the rest of the query
API; the dashboard's writes (ack, silence) go to the alerting endpoints, which check the token.
Views run on a worker thread because they query the store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gpuscope.hub import Hub
from gpuscope.web.dashboard.fleet import PICKER_METRICS, fleet_view, node_view
from gpuscope.web.dashboard.jobs import job_view, jobs_view
from gpuscope.web.dashboard.reports import reports_view
from gpuscope.web.dashboard.services import service_view, services_view

STATIC_DIR = Path(__file__).parent / "dashboard" / "static"
Handler = Callable[[Request], Awaitable[Response]]


class BadParam(Exception):
    """A refused query parameter: answered 400 with the parameter's name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _json(doc: Any, status: int = 200) -> Response:
    # orjson writes NaN/Inf as null, which is what JSON readers expect of a missing value
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _num(request: Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadParam(name, f"{raw!r} is not a number") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise BadParam(name, f"must be a number in {lo:g}..{hi:g}")
    return value


def _text(request: Request, name: str) -> str:
    raw = request.query_params.get(name)
    if raw is None or not 0 < len(raw) <= 256:
        raise BadParam(name, f"query parameter {name!r} is required (1 to 256 characters)")
    return raw


class DashboardApi:
    """The handlers behind the pages; ``clock`` lets tests pin "now"."""

    def __init__(self, hub: Hub, clock: Callable[[], float] = time.time, *, alerting: bool = False) -> None:
        self.hub = hub
        self.clock = clock
        self.alerting = alerting  # whether the hub runs an alerting service (ack, silences)

    def _guard(self, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except BadParam as exc:
                self.hub.counters.inc("dashboard_refused_400")
                return _json({"error": exc.message, "field": exc.field}, 400)
            except KeyError as exc:
                self.hub.counters.inc("dashboard_refused_404")
                unknown = exc.args[0]
                field = next((k for k, v in request.query_params.items() if v == unknown), "name")
                return _json({"error": f"nothing known about {unknown!r}", "field": field}, 404)

        return wrapped

    def _range(self, request: Request) -> tuple[float, float]:
        end = _num(request, "end", self.clock(), 0, 1e11)
        start = _num(request, "start", end - 3600, 0, 1e11)
        if start >= end:
            raise BadParam("start", "must be before end")
        return start, end

    async def fleet(self, request: Request) -> Response:
        metric = request.query_params.get("metric", "gpu_utilization_percent")
        if metric not in PICKER_METRICS:
            raise BadParam("metric", f"{metric!r} is not a per-GPU gauge")
        stale = _num(request, "stale_after", 15.0, 1.0, 86400.0)
        window = self._range(request)
        return _json(await run_in_threadpool(fleet_view, self.hub, metric, stale, window))

    async def node(self, request: Request) -> Response:
        node = _text(request, "node")
        stale = _num(request, "stale_after", 15.0, 1.0, 86400.0)
        return _json(await run_in_threadpool(node_view, self.hub, node, stale))

    async def jobs(self, request: Request) -> Response:
        return _json(await run_in_threadpool(jobs_view, self.hub, self.clock()))

    async def job(self, request: Request) -> Response:
        job = _text(request, "job")
        start, end = self._range(request)
        points = int(_num(request, "points", 300, 10, 2000))
        return _json(await run_in_threadpool(job_view, self.hub, job, start, end, points))

    async def services(self, request: Request) -> Response:
        return _json(await run_in_threadpool(services_view, self.hub, self.clock()))

    async def service(self, request: Request) -> Response:
        name = _text(request, "service")
        return _json(await run_in_threadpool(service_view, self.hub, name, self.clock()))

    async def reports(self, request: Request) -> Response:
        days = _num(request, "days", 30, 1, 366)
        seconds = _num(request, "range", days * 86400.0, 60.0, 366 * 86400.0)
        return _json(await run_in_threadpool(reports_view, self.hub, self.clock(), seconds))

    async def capabilities(self, request: Request) -> Response:
        """What this hub offers beyond the core API, so pages need not probe (and log 404s)."""
        paths = {getattr(r, "path", "") for r in request.app.routes}
        return _json(
            {
                "alerting": self.alerting,
                "lineage": any(p.startswith("/api/v1/lineage") for p in paths),
                "price_per_gpu_hour": self.hub.alerts.price_per_gpu_hour,
                "now": self.clock(),
            }
        )

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def to_ui(self, request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    def routes(self) -> list[BaseRoute]:
        api = {
            "fleet": self.fleet,
            "node": self.node,
            "jobs": self.jobs,
            "job": self.job,
            "services": self.services,
            "service": self.service,
            "reports": self.reports,
            "capabilities": self.capabilities,
        }
        return [
            Route("/", self.to_ui, methods=["GET"]),
            Route("/ui", self.to_ui, methods=["GET"]),
            Route("/ui/", self.index, methods=["GET"]),
            Mount("/ui/static", app=StaticFiles(directory=STATIC_DIR), name="dashboard-static"),
            *(Route(f"/api/v1/ui/{name}", self._guard(h), methods=["GET"]) for name, h in api.items()),
        ]


def dashboard_routes(hub: Hub, *, alerting: bool = False) -> list[BaseRoute]:
    """The routes the hub's app mounts for the dashboard."""
    return DashboardApi(hub, alerting=alerting).routes()
