"""The Prometheus HTTP API's read endpoints, for Grafana and promtool, under ``/prometheus``.

The hub's own ``/api/v1/series`` (one entity's downsampled points, for the dashboard) would clash
with Prometheus' ``/api/v1/series`` (label sets matching selectors), so Prometheus' API lives under
the prefix: a Grafana Prometheus data source points at ``http://HUB:7470/prometheus``.

Queries are the subset of :mod:`gpuscope.promql.parse`, evaluated over the store. With the remote
storage backend the TSDB already speaks PromQL, so ``query`` and ``query_range`` pass through to it.
Answers use Prometheus' envelope: ``{"status": "success", "data": ...}`` or ``{"status": "error",
"errorType": "bad_data", "error": ...}`` with HTTP 400.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.hub import Hub
from gpuscope.promql.evaluate import MAX_POINTS, Evaluator, LabelKey, matches
from gpuscope.promql.parse import PromQLError, Selector, parse, parse_duration
from gpuscope.store.errors import StoreError

PREFIX = "/prometheus/api/v1"
LATEST = 253402300799.0  # 9999-12-31T23:59:59Z
PATHS = ("/query", "/query_range", "/series", "/labels", "/label/{name}/values")

Handler = Callable[[Request], Awaitable[Response]]


def _ok(data: Any) -> JSONResponse:
    return JSONResponse({"status": "success", "data": data})


def _bad(message: str, status: int = 400, kind: str = "bad_data") -> JSONResponse:
    return JSONResponse({"status": "error", "errorType": kind, "error": message}, status_code=status)


def format_value(v: float) -> str:
    """As Prometheus writes sample values: ``1``, ``0.5``, ``NaN``, ``+Inf``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _time(value: str | None, default: float, name: str) -> float:
    if value is None or value == "":
        return default
    try:
        t = float(value)
    except ValueError:
        raise PromQLError(f"{name}: {value!r} is not a unix time in seconds") from None
    if not 0 <= t <= LATEST:
        raise PromQLError(f"{name}: {value!r} is not a unix time between 1970 and 9999")
    return t


def _step(value: str | None) -> float:
    if not value:
        raise PromQLError("step: is required")
    try:
        step = float(value)
    except ValueError:
        step = parse_duration(value)
    if not step > 0 or not math.isfinite(step):
        raise PromQLError("step: must be a positive duration")
    return step


async def _params(request: Request) -> list[tuple[str, str]]:
    """Query string and, for POST, the urlencoded form (how Grafana and promtool send queries)."""
    pairs = list(request.query_params.multi_items())
    if request.method == "POST":
        body = (await request.body()).decode("utf-8", errors="replace")
        pairs += parse_qsl(body, keep_blank_values=True)
    return pairs


def _one(pairs: list[tuple[str, str]], name: str) -> str | None:
    values = [v for k, v in pairs if k == name]
    return values[-1] if values else None


def _metric(key: LabelKey) -> dict[str, str]:
    return dict(key)


class PrometheusApi:
    """Routes of the read API over ``hub``'s store."""

    def __init__(self, hub: Hub, clock: Callable[[], float] = time.time) -> None:
        self.hub = hub
        self.clock = clock

    def routes(self, guard: Callable[[Handler], Handler]) -> list[Route]:
        handlers: dict[str, Handler] = {
            "/query": self.query,
            "/query_range": self.query_range,
            "/series": self.series,
            "/labels": self.labels,
            "/label/{name}/values": self.label_values,
        }
        return [Route(PREFIX + path, guard(h), methods=["GET", "POST"]) for path, h in handlers.items()]

    async def _answer(self, request: Request, work: Callable[[list[tuple[str, str]]], Any]) -> Response:
        pairs = await _params(request)
        try:
            return _ok(await run_in_threadpool(work, pairs))
        except PromQLError as exc:
            return _bad(str(exc))
        except StoreError as exc:
            return _bad(str(exc), 503, "unavailable")

    async def query(self, request: Request) -> Response:
        return await self._answer(request, self._instant)

    async def query_range(self, request: Request) -> Response:
        return await self._answer(request, self._range)

    async def series(self, request: Request) -> Response:
        return await self._answer(request, self._series)

    async def labels(self, request: Request) -> Response:
        return await self._answer(request, lambda pairs: sorted({k for s in self._series(pairs) for k in s}))

    async def label_values(self, request: Request) -> Response:
        name = request.path_params["name"]
        return await self._answer(
            request, lambda pairs: sorted({s[name] for s in self._series(pairs) if name in s})
        )

    def _passthrough(self) -> Any:
        # the remote backend's PromQL client (gpuscope.store.remote.promql.PromQL); None for DuckDB
        return getattr(self.hub.store, "promql", None)

    def _instant(self, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        text = _one(pairs, "query") or ""
        at = _time(_one(pairs, "time"), self.clock(), "time")
        remote = self._passthrough()
        if remote is not None:
            return {"resultType": "vector", "result": remote.instant(text, at)}
        expr = parse(text)
        times = np.array([at])
        if isinstance(expr, Selector) and expr.range_s is not None:
            evaluator = Evaluator(self.hub.store, times, expr.range_s)
            result = []
            for key, ts, vals in evaluator.fetch(expr, expr.range_s):
                inside = (ts > at - expr.range_s) & (ts <= at)
                points = [
                    [float(t), format_value(float(v))] for t, v in zip(ts[inside], vals[inside], strict=True)
                ]
                if points:
                    result.append({"metric": _metric(key), "values": points})
            return {"resultType": "matrix", "result": result}
        value = Evaluator(self.hub.store, times, 1.0).scalar_or_vector(expr)
        if not isinstance(value, dict):
            return {"resultType": "scalar", "result": [at, format_value(float(value[0]))]}
        vector = [
            {"metric": _metric(key), "value": [at, format_value(float(v[0]))]}
            for key, v in sorted(value.items())
            if not math.isnan(v[0])
        ]
        return {"resultType": "vector", "result": vector}

    def _range(self, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        text = _one(pairs, "query") or ""
        now = self.clock()
        start = _time(_one(pairs, "start"), now - 3600, "start")
        end = _time(_one(pairs, "end"), now, "end")
        step = _step(_one(pairs, "step"))
        if end < start:
            raise PromQLError("end: must not be before start")
        if (end - start) / step > MAX_POINTS:
            raise PromQLError(f"exceeded maximum resolution of {MAX_POINTS} points per series: raise step")
        remote = self._passthrough()
        if remote is not None:
            return {"resultType": "matrix", "result": remote.range(text, start, end, step)}
        expr = parse(text)
        times = (start + step * np.arange(math.floor((end - start) / step) + 1)).astype(np.float64)
        value = Evaluator(self.hub.store, times, step).scalar_or_vector(expr)
        rows = value.items() if isinstance(value, dict) else [((), value)]
        result = []
        for key, values in sorted(rows):
            points = [
                [float(t), format_value(float(v))]
                for t, v in zip(times, values, strict=True)
                if not math.isnan(v)
            ]
            if points:
                result.append({"metric": _metric(key), "values": points})
        return {"resultType": "matrix", "result": result}

    def _series(self, pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
        """Label sets (with ``__name__``) of the stored series matching any ``match[]`` selector."""
        selectors = []
        for text in [v for k, v in pairs if k == "match[]"]:
            expr = parse(text)
            if not isinstance(expr, Selector):
                raise PromQLError(f"match[]: {text!r} is not a series selector")
            selectors.append(expr)
        found: dict[LabelKey, dict[str, str]] = {}
        for row in self.hub.store.snapshot(None, None):
            labels = {str(k): str(v) for k, v in row["labels"].items()}
            for metric in row["values"]:
                series = {**labels, "__name__": str(metric)}
                if not selectors or any(
                    s.metric == metric and matches(series, s.matchers) for s in selectors
                ):
                    found[tuple(sorted(series.items()))] = series
        return [found[k] for k in sorted(found)]
