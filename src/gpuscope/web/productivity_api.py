"""HTTP face of the productivity model: GPU time per state, cause and owner; node drains.

``GET /api/v1/productivity?by=fleet|node|job|team|service&range=1h`` (or ``start``/``end``) answers
GPU-hours and dollars per state and cause for each group, largest waste first, with how many GPUs
are in each state now. ``POST /api/v1/nodes/{node}/drain`` takes a node out of service for a
time: its GPU time counts as maintenance and, on a hub that runs alerting, its alerts are
silenced for as long (writes need the admin scope, like every write without a declared scope).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.alert.labels import Matcher
from gpuscope.alert.service import AlertingService
from gpuscope.hub import Hub
from gpuscope.productivity import GROUPINGS
from gpuscope.web.errors import ApiError, error_response
from gpuscope.web.guard import PRINCIPAL_KEY

_RANGE_RE = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_RANGE_S = 400 * 86400.0
MAX_DRAIN_S = 30 * 86400.0


def parse_range(raw: str) -> float:
    """``90s``, ``15m``, ``2h``, ``30d`` -> seconds."""
    match = _RANGE_RE.fullmatch(raw)
    if match is None:
        raise ValueError(f"{raw!r} is not a duration such as 90s, 15m, 2h or 30d")
    seconds = int(match.group(1)) * _UNIT[match.group(2)]
    if seconds > MAX_RANGE_S:
        raise ValueError("at most 400d")
    return seconds


def _number(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, name, f"{raw!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value <= 1e11:
        raise ApiError(400, name, "must be seconds since the epoch")
    return value


class ProductivityApi:
    def __init__(
        self, hub: Hub, alerting: AlertingService | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.hub = hub
        #: where a drain's silence goes (none in sim-eval or a bare test hub)
        self.alerting = alerting
        self.clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/api/v1/productivity", self._safe(self.productivity), methods=["GET"]),
            Route("/api/v1/productivity/gpus", self._safe(self.gpus), methods=["GET"]),
            Route("/api/v1/nodes/drains", self._safe(self.drains), methods=["GET"]),
            Route("/api/v1/nodes/{node}/drain", self._safe(self.drain), methods=["POST", "DELETE"]),
        ]

    @staticmethod
    def _safe(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)  # type: ignore[no-any-return]
            except ApiError as exc:
                return error_response(exc.status, exc.field, exc.message)

        return wrapped

    def window(self, request: Request) -> tuple[float, float]:
        end = _number(request, "end")
        end = self.clock() if end is None else end
        start = _number(request, "start")
        if start is None:
            try:
                start = end - parse_range(request.query_params.get("range", "1h"))
            except ValueError as exc:
                raise ApiError(400, "range", str(exc)) from None
        if start > end:
            raise ApiError(400, "start", "must not be after end")
        return start, end

    async def productivity(self, request: Request) -> Response:
        by = request.query_params.get("by", "fleet")
        if by not in GROUPINGS:
            raise ApiError(400, "by", f"must be one of {', '.join(GROUPINGS)}")
        start, end = self.window(request)
        model = self.hub.productivity
        doc = model.summary(by, start, end)
        doc["now"] = dict(Counter(g["state"] for g in model.gpu_states()))
        return JSONResponse(doc)

    async def gpus(self, request: Request) -> Response:
        return JSONResponse({"gpus": self.hub.productivity.gpu_states()})

    async def drains(self, request: Request) -> Response:
        return JSONResponse({"drains": [drain_json(d) for d in self.hub.productivity.active_drains()]})

    async def drain(self, request: Request) -> Response:
        if PRINCIPAL_KEY not in request.scope:
            raise ApiError(401, "authorization", "this request was not authenticated")
        node = request.path_params["node"]
        if not 0 < len(node) <= 256:
            raise ApiError(400, "node", "must be 1 to 256 characters")
        model = self.hub.productivity
        if request.method == "DELETE":
            ended = model.undrain(node)
            if ended is None:
                raise ApiError(404, "node", f"{node} is not drained")
            if ended.silence is not None and self.alerting is not None:
                with contextlib.suppress(KeyError):  # expired by hand already
                    self.alerting.expire_silence(ended.silence)
            return JSONResponse({"node": node, "drained": False})
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise ApiError(400, "body", "must be a JSON object") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body", "must be a JSON object")
        seconds = body.get("for_seconds")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= MAX_DRAIN_S
        ):
            raise ApiError(400, "for_seconds", f"must be a number of seconds in (0, {MAX_DRAIN_S:.0f}]")
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 1000:
            raise ApiError(400, "reason", "must be a string of at most 1000 characters")
        who = getattr(request.scope[PRINCIPAL_KEY], "name", "")
        now = self.clock()
        drain = model.drain(node, now + float(seconds), reason, who)
        if self.alerting is not None:
            drain.silence = self.alerting.silence(
                [Matcher("node", "=", node)], float(seconds), by=who or "drain", comment=f"drained: {reason}"
            ).id
        return JSONResponse(drain_json(drain))


def drain_json(drain: Any) -> dict[str, Any]:
    return {
        "node": drain.node,
        "until": drain.until,
        "reason": drain.reason,
        "by": drain.by,
        "silence": drain.silence,
    }
