"""A whole HTTP answer (status, headers, body) that both ways of serving ingest send as they are:
the ASGI app through ``send``, and :mod:`gpuscope.web.lean_ingest` straight to the socket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Send

RawHeaders = list[tuple[bytes, bytes]]

_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class Answer:
    """A response: its status, its headers in the order they are sent (names in lower case, after
    the server's own ``date``), and its body."""

    status: int
    headers: RawHeaders
    body: bytes

    async def send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def json_answer(status: int, doc: dict[str, Any], headers: RawHeaders | None = None) -> Answer:
    """A JSON answer, with the headers a Starlette ``JSONResponse`` would send after ``headers``."""
    body = orjson.dumps(doc)
    length = (b"content-length", str(len(body)).encode("latin-1"))
    return Answer(status, [*(headers or ()), length, _JSON], body)
