"""HTTP endpoints of the alerting layer: ranked alerts and incidents, ack, silences, history.

Mounted by :class:`.api.HubApi` beside the core API; writes need the same bearer
token as ingest. Without an alerting service attached (a bare hub) they answer 503.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import parse_matchers
from gpuscope.alert.ranking import rank_alerts, rank_incidents
from gpuscope.alert.service import AlertingService
from gpuscope.hub import Hub
from gpuscope.web.errors import ApiError, json_safe

Handler = Callable[[Request], Awaitable[Response]]
MAX_BODY = 64 * 1024


class AlertingApi:
    def __init__(
        self,
        hub: Hub,
        service: AlertingService | None,
        authorize: Callable[[Request], None],
    ) -> None:
        self.hub = hub
        self.service = service
        self.authorize = authorize

    def routes(self) -> list[tuple[str, Handler, list[str]]]:
        return [
            ("/api/v1/alerting/alerts", self.alerts, ["GET"]),
            ("/api/v1/alerting/incidents", self.incidents, ["GET"]),
            ("/api/v1/alerting/status", self.status, ["GET"]),
            ("/api/v1/alerts/{id}/ack", self.ack, ["POST"]),
            ("/api/v1/alerts/{id}/history", self.history, ["GET"]),
            ("/api/v1/silences", self.list_silences, ["GET"]),
            ("/api/v1/silences", self.add_silence, ["POST"]),
            ("/api/v1/silences/{id}", self.expire_silence, ["DELETE"]),
        ]

    def _service(self) -> AlertingService:
        service = self.service
        if service is None:
            raise ApiError(503, "alerting", "this hub runs no alerting service")
        return service

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise ApiError(413, "body", f"over the limit of {MAX_BODY} bytes")
        try:
            doc = orjson.loads(raw or b"{}")
        except orjson.JSONDecodeError:
            raise ApiError(400, "body", "not valid JSON") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "body", "must be a JSON object")
        return doc

    async def alerts(self, request: Request) -> Response:
        service = self._service()
        state = request.query_params.get("state", "firing")
        if state not in {"firing", "all"}:
            raise ApiError(400, "state", "must be 'firing' or 'all'")

        def work() -> dict[str, Any]:
            alerts = self.hub.firing() if state == "firing" else self.hub.alerts.all()
            rows = [{**a.to_dict(), **service.status(a)} for a in rank_alerts(alerts)]
            return {"alerts": rows, "pending": self.hub.alerts.pending()}

        return JSONResponse(json_safe(await run_in_threadpool(work)))

    async def incidents(self, request: Request) -> Response:
        state = request.query_params.get("state", "all")
        if state not in {"open", "all"}:
            raise ApiError(400, "state", "must be 'open' or 'all'")
        rows = rank_incidents(self.hub.alerts.incidents(), self.hub.alerts.all())
        if state == "open":
            rows = [r for r in rows if r["resolved_at"] is None]
        return JSONResponse(json_safe({"incidents": rows}))

    async def status(self, request: Request) -> Response:
        service = self._service()
        stats = await run_in_threadpool(service.outbox.stats)
        return JSONResponse(
            {
                "outbox": stats,
                "receivers": sorted(service.settings.notifiers),
                "groups": service.dispatcher.pending_groups(),
                "triage": service.triage_stats(),
            }
        )

    async def ack(self, request: Request) -> Response:
        self.authorize(request)
        service = self._service()
        body = await self._body(request)
        by = str(body.get("by", "")).strip()
        if not 0 < len(by) <= 128:
            raise ApiError(400, "by", "say who acknowledges (1 to 128 characters)")
        comment = str(body.get("comment", ""))[:1024]
        target = request.path_params["id"]
        try:
            alerts = await run_in_threadpool(service.ack, target, by, comment)
        except KeyError:
            raise ApiError(404, "id", f"no alert or incident {target!r}") from None
        return JSONResponse({"acknowledged": [a.id for a in alerts]})

    async def history(self, request: Request) -> Response:
        service = self._service()
        target = request.path_params["id"]
        rows = await run_in_threadpool(service.history, target)
        # an alert the hub has let go of keeps its stored history; one it never raised has none
        if not rows and self.hub.alerts.get(target) is None:
            raise ApiError(404, "id", f"no alert {target!r}")
        return JSONResponse({"history": rows})

    async def list_silences(self, request: Request) -> Response:
        service = self._service()
        expired = request.query_params.get("expired") == "true"
        now = service.clock()
        items = service.silences.list(now, include_expired=expired)
        return JSONResponse({"silences": [{**s.to_dict(), "active": s.active(now)} for s in items]})

    async def add_silence(self, request: Request) -> Response:
        self.authorize(request)
        service = self._service()
        body = await self._body(request)
        try:
            matchers = parse_matchers(body.get("matchers"), "matchers")
            duration = parse_duration(body.get("duration", "1h"), "duration")
            starts = body.get("starts_at")
            if starts is not None and (isinstance(starts, bool) or not isinstance(starts, int | float)):
                raise ValueError("starts_at: must be a Unix time")
            by = str(body.get("created_by", "api"))[:128]
            silence = service.silence(matchers, duration, by, str(body.get("comment", ""))[:1024], starts)
        except ValueError as exc:
            raise ApiError(400, "matchers" if "matcher" in str(exc) else "body", str(exc)) from None
        return JSONResponse(silence.to_dict(), status_code=201)

    async def expire_silence(self, request: Request) -> Response:
        self.authorize(request)
        service = self._service()
        sid = request.path_params["id"]
        try:
            silence = service.expire_silence(sid)
        except KeyError:
            raise ApiError(404, "id", f"no silence {sid!r}") from None
        return JSONResponse(silence.to_dict())
