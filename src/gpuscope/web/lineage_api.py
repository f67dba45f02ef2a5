"""HTTP routes of the lineage registry, for the hub to mount beside its own API.

``LineageApi(registry, authorize_write).routes()`` gives Starlette routes under
``/api/v1/lineage``. Writes (runs, checkpoints, versions, promotions) go through the hub's
``authorize_write`` (bearer tokens); every refusal is a 4xx whose JSON names the field, as in
the rest of the API. Checkpoints, versions and promotions take an optional ``at`` (Unix seconds, not
in the future) so that history that happened before the hub heard of it keeps its own times.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.lineage.registry import LineageError, LineageRegistry

Handler = Callable[[Request], Awaitable[Response]]
MAX_BODY = 64 * 1024


def _error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


class LineageApi:
    def __init__(
        self, registry: LineageRegistry, authorize_write: Callable[[Request], None] | None = None
    ) -> None:
        self.registry = registry
        self.authorize_write = authorize_write

    def routes(self) -> list[Route]:
        base = "/api/v1/lineage"
        return [
            Route(f"{base}/runs", self._guard(self.add_run, write=True), methods=["POST"]),
            Route(f"{base}/checkpoints", self._guard(self.add_checkpoint, write=True), methods=["POST"]),
            Route(f"{base}/versions", self._guard(self.register, write=True), methods=["POST"]),
            Route(f"{base}/promotions", self._guard(self.promote, write=True), methods=["POST"]),
            Route(f"{base}/versions/{{model:path}}/{{version}}", self._guard(self.show), methods=["GET"]),
            Route(f"{base}/deployments", self._guard(self.deployments), methods=["GET"]),
            Route(f"{base}/changes", self._guard(self.changes), methods=["GET"]),
        ]

    def _guard(self, handler: Callable[[Request], Awaitable[Any]], write: bool = False) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                if write and self.authorize_write is not None:
                    self.authorize_write(request)
                return JSONResponse(await handler(request))
            except LineageError as exc:
                return _error(exc.status, exc.field, exc.message)
            except Exception as exc:
                # the hub's own ApiError (auth) carries status and field; pass it through
                status, field = getattr(exc, "status", None), getattr(exc, "field", None)
                if isinstance(status, int) and isinstance(field, str):
                    return _error(status, field, str(exc))
                raise

        return wrapped

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await request.body()
        if len(body) > MAX_BODY:
            raise LineageError("body", f"over the limit of {MAX_BODY} bytes", 413)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise LineageError("body", f"not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise LineageError("body", "must be a JSON object")
        return data

    @staticmethod
    def _get(data: dict[str, Any], key: str, default: Any = ...) -> Any:
        if key in data:
            return data[key]
        if default is ...:
            raise LineageError(key, "is required")
        return default

    async def add_run(self, request: Request) -> dict[str, Any]:
        d = await self._body(request)
        meta = self._get(d, "meta", {})
        if not isinstance(meta, dict):
            raise LineageError("meta", "must be an object")
        started = self._time(d, "started_at")
        await run_in_threadpool(self.registry.add_run, self._get(d, "job"), meta, started)
        return {"ok": True}

    def _time(self, data: dict[str, Any], key: str) -> float | None:
        """An optional Unix time (history registered after the fact); not in the future."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise LineageError(key, "must be a Unix time in seconds")
        if not 0 <= value <= self.registry.clock() + 60.0:
            raise LineageError(key, "must be a Unix time in seconds, not in the future")
        return float(value)

    async def add_checkpoint(self, request: Request) -> dict[str, Any]:
        d = await self._body(request)
        g = self._get
        at = self._time(d, "at")
        await run_in_threadpool(
            self.registry.add_checkpoint,
            g(d, "job"),
            g(d, "step"),
            g(d, "manifest_hash"),
            g(d, "path", ""),
            at,
        )
        return {"ok": True}

    async def register(self, request: Request) -> dict[str, Any]:
        d = await self._body(request)
        g = self._get
        metrics = g(d, "metrics", {})
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
        ):
            raise LineageError("metrics", "must be an object of numbers")
        at = self._time(d, "at")
        await run_in_threadpool(
            self.registry.register_version,
            g(d, "model"),
            g(d, "version"),
            g(d, "job"),
            g(d, "step"),
            metrics,
            at,
        )
        return await run_in_threadpool(self.registry.version, d["model"], d["version"])

    async def promote(self, request: Request) -> dict[str, Any]:
        d = await self._body(request)
        g = self._get
        at = self._time(d, "at")

        def work() -> dict[str, Any]:
            return self.registry.promote(
                g(d, "service"),
                g(d, "model"),
                g(d, "version"),
                traffic_share=g(d, "traffic_share", 1.0),
                alias=g(d, "alias", None),
                at=at,
            )

        return await run_in_threadpool(work)

    async def show(self, request: Request) -> dict[str, Any]:
        model, version = request.path_params["model"], request.path_params["version"]
        return await run_in_threadpool(self.registry.version, model, version)

    async def deployments(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        rows = await run_in_threadpool(self.registry.deployments, q.get("service"), q.get("model"))
        return {"deployments": rows}

    async def changes(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        service = q.get("service")
        if not service:
            raise LineageError("service", "query parameter 'service' is required")
        try:
            at = float(q.get("at", self.registry.clock()))
            window = float(q.get("window", 3600.0))
        except ValueError:
            raise LineageError("at", "'at' and 'window' must be numbers") from None
        rows = await run_in_threadpool(self.registry.changes_before, service, at, window)
        return {"service": service, "at": at, "window": window, "changes": rows}
