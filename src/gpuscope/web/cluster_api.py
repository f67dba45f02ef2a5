"""The cluster's HTTP surface: the internal observe endpoint peers forward batch parts to, and
the cluster's part of ``/api/v1/health``. A hub outside a cluster has neither."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.cluster import parts
from gpuscope.cluster.forward import HOPS_HEADER, OBSERVE_PATH
from gpuscope.cluster.member import ClusterMember
from gpuscope.cluster.placement import MAX_HOPS
from gpuscope.ingest.payload import Limits, PayloadError, decode_json, parse_batch
from gpuscope.web.errors import ApiError

Handler = Callable[[Request], Awaitable[Response]]
Guard = Callable[[Handler], Handler]


def cluster_routes(member: ClusterMember | None, guard: Guard, limits: Limits) -> list[Route]:
    """``POST /api/v1/cluster/forward`` on a cluster member; nothing on a single hub."""
    if member is None:
        return []
    digest = hashlib.sha256(member.cfg.peer_token.encode()).digest()

    async def observe(request: Request) -> Response:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = hashlib.sha256(token.strip().encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, digest):
            raise ApiError(403, "authorization", "the cluster's peer token is required")
        hops_raw = request.headers.get(HOPS_HEADER, "1")
        if not hops_raw.isdigit() or int(hops_raw) > MAX_HOPS:
            raise ApiError(400, HOPS_HEADER, f"must be an integer in 0..{MAX_HOPS}")
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        body = await request.body()
        if len(body) > max(limits.max_body_bytes, parts.MAX_REQUEST_BYTES):
            raise ApiError(413, "body", f"over the limit of {limits.max_body_bytes} bytes")

        def work() -> dict[str, Any]:
            try:
                if ctype == parts.CONTENT_TYPE:
                    batches = parts.decode_parts(body, limits)
                else:  # one JSON batch, from a peer of an earlier version
                    batches = [parse_batch(decode_json(body, limits), limits)]
            except PayloadError as exc:
                member.counters.inc("cluster_observe_rejected")
                raise ApiError(400, exc.field, exc.message) from None
            return member.route_many(batches, int(hops_raw))

        return JSONResponse(await run_in_threadpool(work))

    return [Route(OBSERVE_PATH, guard(observe), methods=["POST"])]


def cluster_health(member: ClusterMember | None) -> dict[str, Any]:
    """Membership and owned shards, for ``/api/v1/health`` (empty outside a cluster)."""
    if member is None:
        return {}
    return {"cluster": member.status()}
