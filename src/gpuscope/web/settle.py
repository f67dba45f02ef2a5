"""Reads see what every acknowledged batch taught the hub, as the store's reads see every row.

The hub's detectors and observers (productivity model, lineage, quality monitor) see acknowledged
batches in its observe stage, a tick at once (:mod:`gpuscope.observing`). A read that arrives in
between first lets them see what is waiting, on a worker thread, so an answer never lags the
batches its caller was already told were stored.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope.hub import Hub


class SettleReads:
    """ASGI middleware: a GET first drains the hub's observe stage when anything waits there."""

    def __init__(self, app: ASGIApp, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and self.hub.unsettled():
            await run_in_threadpool(self.hub.settle)
        await self.app(scope, receive, send)
