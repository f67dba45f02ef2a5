"""A recording stand-in for the Kubernetes API server on loopback, for the agent's API client
(gpuscope.kube.metadata): each test answers GET requests its own way; every request is recorded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from support import QuietHandler, loopback_http

#: (path with query, the Authorization header or None) -> (HTTP status, JSON body)
Answer = Callable[[str, str | None], tuple[int, bytes]]


@contextmanager
def kube_api_server(answer: Answer) -> Iterator[tuple[str, list[str]]]:
    """``(base URL, the paths requested so far)`` of a server that answers every GET with ``answer``."""
    seen: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            status, body = answer(self.path, self.headers.get("Authorization"))
            self.reply(status, body, "application/json")

    with loopback_http(Handler) as url:
        yield url, seen
