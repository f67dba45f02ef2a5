"""A real HTTP receiver on loopback that records what notifiers POST; it can be taken down and back."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support import free_port


class Sink:
    def __init__(self, port: int | None = None, status: int = 200) -> None:
        self.port = port or free_port()
        self.status = status
        self.received: list[tuple[str, Any, float]] = []  # (path, JSON body, monotonic arrival)
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"null")
                with sink._cond:
                    if sink.status < 300:
                        sink.received.append((self.path, body, time.monotonic()))
                    sink._cond.notify_all()
                self.send_response(sink.status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def bodies(self, path: str | None = None) -> list[Any]:
        with self._cond:
            return [b for p, b, _ in self.received if path in (None, p)]

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"sink got {len(self.received)} requests, expected {count}")
                self._cond.wait(left)
            return [b for _, b, _ in self.received]


class Clock:
    """A clock the test moves by hand (``clock.t += 60``)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
