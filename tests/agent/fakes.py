"""A virtual clock and an in-process fake hub (httpx.MockTransport) for the agent tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_CONTENT_TYPE
from gpuscope.ingest.frame import decode_body
from gpuscope.model import Batch


class FakeClock:
    """Virtual seconds: ``clock()`` reads them, ``clock.sleep(dt)`` moves them on."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.t += dt


@dataclass
class FakeHub:
    """Ingest endpoint that validates every body with the real parser and de-duplicates batch ids.

    ``down``: connections are refused. ``status``: answer this status without storing.
    ``lose_replies``: store the next N batches but lose the answer (a timeout at the agent).
    ``refuse``: per batch, ``(status, message)`` to refuse it permanently, or None.
    ``reads_frames``: False plays a hub from before binary frames (415 to a frame, as its route did).
    """

    down: bool = False
    status: int | None = None
    retry_after: str | None = None
    lose_replies: int = 0
    refuse: Callable[[Batch], tuple[int, str] | None] = lambda b: None
    stored: list[Batch] = field(default_factory=list)
    seen_ids: list[str] = field(default_factory=list)  # every id that reached the hub, repeats too
    requests: list[httpx.Request] = field(default_factory=list)
    reads_frames: bool = True

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        assert request.url.path == "/api/v1/ingest"
        ctype = request.headers.get("content-type", "")
        if ctype == FRAME_CONTENT_TYPE and not self.reads_frames:
            return httpx.Response(415, json={"error": "send application/json", "field": "content-type"})
        batch = decode_body(ctype, request.content)
        assert batch.batch_id is not None
        self.seen_ids.append(batch.batch_id)
        if self.status is not None:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return httpx.Response(self.status, json={"error": "busy", "field": "body"}, headers=headers)
        refusal = self.refuse(batch)
        if refusal is not None:
            return httpx.Response(refusal[0], json={"error": refusal[1], "field": "frames[0].metrics[0]"})
        if batch.batch_id not in {b.batch_id for b in self.stored}:
            self.stored.append(batch)
        if self.lose_replies:
            self.lose_replies -= 1
            raise httpx.ReadTimeout("reply lost", request=request)
        return httpx.Response(200, content=orjson.dumps({"samples": batch.sample_count}))

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    @property
    def stored_ids(self) -> list[str]:
        return [b.batch_id or "" for b in self.stored]
