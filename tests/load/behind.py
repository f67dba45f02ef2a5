"""A loopback hub behind on ingest, for the load generator's tests: it refuses the requests its policy
picks with 503 and ``Retry-After: 1``, as a real hub that sheds load does, takes the others with a
200, and keeps every request in the order it arrived."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpuscope.ingest.overload import SENDER_HEADER, URGENT_EVENTS, URGENT_HEADER
from support import QuietHandler, loopback_http


@dataclass(frozen=True, slots=True)
class Knock:
    """One request the hub was sent."""

    arrival: float  # time.monotonic() when it arrived
    sender: str  # its X-Gpuscope-Sender header ("" when it named none)
    urgent: bool  # marked X-Gpuscope-Urgent: events
    body: bytes
    refused: bool


#: whether the hub refuses a request: (is it marked urgent, the requests before it) -> refuse
Policy = Callable[[bool, Sequence[Knock]], bool]


class BehindHub:
    def __init__(self, refuse: Policy) -> None:
        self.refuse = refuse
        self.url = ""
        self.knocks: list[Knock] = []
        self.lock = threading.Lock()

    @property
    def taken(self) -> list[bytes]:
        """The bodies of the requests it took, in the order they arrived."""
        with self.lock:
            return [k.body for k in self.knocks if not k.refused]


@contextlib.contextmanager
def behind_hub(refuse: Policy) -> Iterator[BehindHub]:
    hub = BehindHub(refuse)

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            urgent = self.headers.get(URGENT_HEADER) == URGENT_EVENTS
            with hub.lock:
                refused = hub.refuse(urgent, hub.knocks)
                sender = self.headers.get(SENDER_HEADER, "")
                hub.knocks.append(Knock(time.monotonic(), sender, urgent, body, refused))
            if refused:
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.reply(200, b'{"accepted": {"samples": 1, "events": 0, "training": 0}}', "application/json")

    with loopback_http(Handler) as url:
        hub.url = url
        yield hub
