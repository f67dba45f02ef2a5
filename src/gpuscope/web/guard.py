"""The hub's front door: every request is authenticated, scoped, rate limited and, when it is an
admin write, audited, before it reaches a handler.

Each route needs one scope, declared in :data:`ROUTE_SCOPES`; a route not listed there needs
``read`` for GET and ``admin`` for anything else, so a new write endpoint is never open by
accident. The dashboard's page and static files and ``/openapi.json`` are public; the JSON
behind the pages is a read like any other.

Refusals: 401 without a usable token (and ``WWW-Authenticate: Bearer``), 403 naming the scope a
valid token lacks, 429 with ``Retry-After`` over a token's rate limit. Reads without a token are
allowed only on a loopback listener, and only while ``auth.require_read_token`` is false.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuscope.counters import Counters
from gpuscope.web.answer import Answer
from gpuscope.web.auth import ADMIN, ANONYMOUS, INGEST, READ, SCOPES, AuditLog, AuthSettings, RateLimiter
from gpuscope.web.errors import ApiError
from gpuscope.web.prom_api import PATHS as PROMETHEUS_PATHS

PUBLIC = "public"
PRINCIPAL_KEY = "gpuscope.principal"

#: (method, route path) -> the scope it needs
ROUTE_SCOPES: dict[tuple[str, str], str] = {
    ("POST", "/api/v1/ingest"): INGEST,
    ("POST", "/api/v1/cluster/forward"): INGEST,  # a peer hub passing on agents' batches
    ("POST", "/v1/metrics"): INGEST,  # OpenTelemetry's OTLP/HTTP exports
    ("POST", "/v1/traces"): INGEST,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/"): PUBLIC,
    ("GET", "/ui"): PUBLIC,
    ("GET", "/ui/"): PUBLIC,
    ("GET", "/ui/static"): PUBLIC,
    ("GET", "/api/v1/audit"): ADMIN,
    ("POST", "/api/v1/alerts/{id}/ack"): ADMIN,
    ("POST", "/api/v1/silences"): ADMIN,
    ("DELETE", "/api/v1/silences/{id}"): ADMIN,
    ("POST", "/api/v1/lineage/runs"): ADMIN,
    ("POST", "/api/v1/lineage/checkpoints"): ADMIN,
    ("POST", "/api/v1/lineage/versions"): ADMIN,
    ("POST", "/api/v1/lineage/promotions"): ADMIN,
}
# Prometheus' read API takes its queries as POSTed forms (Grafana, promtool): still reads
ROUTE_SCOPES |= {("POST", f"/prometheus/api/v1{p}"): READ for p in PROMETHEUS_PATHS}
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def require_principal(scope: Scope) -> None:
    """Refuse (401) a write that did not pass :class:`AuthMiddleware`: the middleware authorised
    the request for its route's scope, and a handler reached any other way (mounted outside it)
    must not write unauthenticated."""
    if PRINCIPAL_KEY not in scope:
        raise ApiError(401, "authorization", "this request was not authenticated")


def required_scope(method: str, path: str) -> str:
    """The scope a request to route ``path`` with ``method`` needs (``public``: none)."""
    method = "GET" if method == "HEAD" else method
    declared = ROUTE_SCOPES.get((method, path))
    if declared is not None:
        return declared
    return READ if method in _READ_METHODS else ADMIN


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: a token's name (never the token) and its scopes."""

    name: str
    scopes: frozenset[str]


class AuthMiddleware:
    """ASGI middleware around the hub's app; see the module docstring for the rules."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: AuthSettings,
        routes: Callable[[], list[BaseRoute]],
        open_reads: bool,
        counters: Counters,
        audit: AuditLog,
        clock: Callable[[], float] = time.time,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.routes = routes
        self.open_reads = open_reads and not settings.require_read_token
        self.counters = counters
        self.audit = audit
        self.clock = clock
        #: shared by the instances guarding one hub's routes (its ingest fast path and the rest)
        self.limiter = limiter if limiter is not None else RateLimiter(settings)
        self._static: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    def _route(self, scope: Scope) -> tuple[str, dict[str, Any]]:
        """(route path, path parameters) of the route the request will reach (its own path if none)."""
        key = (scope["method"], scope["path"])
        hit = self._static.get(key)
        if hit is not None:
            return hit
        partial: tuple[str, dict[str, Any]] | None = None
        for route in self.routes():
            match, child = route.matches(scope)
            path = str(getattr(route, "path", scope["path"]))
            found = (path, dict(child.get("path_params", {})))
            if match is Match.FULL:
                if not found[1] and not isinstance(route, Mount) and len(self._static) < 1024:
                    self._static[key] = found
                return found
            if match is Match.PARTIAL and partial is None:
                partial = found
        return partial or (scope["path"], {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, params = self._route(scope)
        need = required_scope(scope["method"], path)
        if need == PUBLIC:
            await self.app(scope, receive, send)
            return
        found = self.authorize(need, authorization(scope))
        if isinstance(found, Answer):
            await found.send(send)
            return
        principal = found
        scope[PRINCIPAL_KEY] = principal
        if need == ADMIN and scope["method"] not in _READ_METHODS:
            await self.app(scope, receive, self._audited(scope, send, principal, path, params))
        else:
            await self.app(scope, receive, send)

    def authorize(self, need: str, header: bytes) -> Principal | Answer:
        """Who sends a request needing scope ``need`` with Authorization ``header`` (empty: none),
        or the refusal to answer (401, 403, 429), counted. A principal's request is taken from its
        rate limit."""
        found = self._authenticate(need, header)
        if isinstance(found, Answer):
            return found
        wait = self.limiter.take(found.name, need)
        if wait > 0:
            self.counters.inc(f"rate_limited.{found.name}")
            retry = max(1, math.ceil(wait))
            return _refusal(
                429,
                f"over the rate limit of token {found.name!r} for {need}; retry in {retry} s",
                {"retry-after": str(retry)},
            )
        return found

    def _authenticate(self, need: str, header: bytes) -> Principal | Answer:
        if not self.settings.tokens:  # no token configured: a loopback-only hub, open to all
            return Principal(ANONYMOUS, frozenset(SCOPES))
        if not header:
            if need == READ and self.open_reads:
                return Principal(ANONYMOUS, frozenset({READ}))
            self.counters.inc("auth_refused_401")
            what = "write" if need != READ else "read on this listener"
            return _refusal(
                401,
                f"a bearer token with scope {need!r} is required to {what}",
                {"www-authenticate": "Bearer"},
            )
        scheme, _, presented = header.decode("latin-1").partition(" ")
        token = self.settings.match(presented.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            self.counters.inc("auth_refused_403")
            return _refusal(403, "the token is not valid")
        if need not in token.scopes:
            self.counters.inc("auth_refused_403")
            return _refusal(403, f"token {token.name!r} lacks the scope {need!r} this needs")
        return Principal(token.name, token.scopes)

    def _audited(self, scope: Scope, send: Send, who: Principal, path: str, params: dict[str, Any]) -> Send:
        """``send`` that records the action, durably, before its answer leaves."""
        client = scope.get("client")

        async def audited_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry = {
                    "ts": self.clock(),
                    "token": who.name,
                    "action": f"{scope['method']} {path}",
                    "target": {k: str(v) for k, v in params.items()} or scope["path"],
                    "source": f"{client[0]}:{client[1]}" if client else None,
                    "status": int(message["status"]),
                }
                try:
                    await run_in_threadpool(self.audit.append, entry)
                except OSError:
                    self.counters.inc("audit_write_errors")
            await send(message)

        return audited_send


def authorization(scope: Scope) -> bytes:
    """The request's first Authorization header (empty when none)."""
    for k, v in scope["headers"]:
        if k == b"authorization":
            return v  # type: ignore[no-any-return]
    return b""


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    body = orjson.dumps({"error": message, "field": "authorization"})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Answer(status, raw, body)


def document_security(doc: dict[str, Any]) -> dict[str, Any]:
    """Adds the bearer scheme to an OpenAPI document, and to each operation the scope it needs
    (``x-required-scope``), the 401/403/429 it may answer, or ``security: []`` when public."""
    doc.setdefault("components", {})["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `gpuscope token create`; scopes: " + ", ".join(SCOPES),
        }
    }
    refusal = {
        "description": "Refused by authentication, scope or rate limit; `field` is authorization",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            need = required_scope(method.upper(), path)
            if need == PUBLIC:
                op["security"] = []
                continue
            op["security"] = [{"bearer": []}]
            op["x-required-scope"] = need
            responses = op.setdefault("responses", {})
            for status in ("401", "403", "429"):
                responses.setdefault(status, refusal)
    return doc
