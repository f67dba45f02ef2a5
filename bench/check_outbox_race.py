"""The outbox race, run many times: the background sender and a direct ``deliver_due`` at once.

Each run queues three notifications for one loopback receiver, starts the background sender and at
once delivers from the calling thread too, then counts runs in which the receiver was told any
notification twice. Not a test (it depends on thread timing); the suite's deterministic test is
``tests/alert/test_alert_outbox.py``. Figures are in docs/scaling.md.

    .venv/bin/python bench/check_outbox_race.py [RUNS]
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port
from gpuscope.alert.notify.base import Request
from gpuscope.alert.outbox import Outbox, http_sender
from gpuscope.alert.statedb import StateDB


class Receiver:
    """A loopback webhook receiver that keeps every body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                with receiver.lock:
                    receiver.bodies.append(int(body["n"]))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.bodies = []

    def told_twice(self) -> bool:
        with self.lock:
            return any(c > 1 for c in Counter(self.bodies).values())


def one_run(receiver: Receiver) -> bool:
    """True when the receiver was told a notification twice."""
    receiver.reset()
    outbox = Outbox(StateDB(), sender=http_sender())
    outbox.start()
    try:
        url = f"http://127.0.0.1:{receiver.port}/hook"
        outbox.enqueue("hook", "webhook", [Request(url, {"n": n}) for n in range(3)])
        outbox.deliver_due()
        deadline = time.monotonic() + 10
        while outbox.stats()["pending"] and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        outbox.stop()
    return receiver.told_twice()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    receiver = Receiver()
    try:
        twice = sum(one_run(receiver) for _ in range(runs))
    finally:
        receiver.server.shutdown()
    print(f"told twice in {twice} of {runs} runs")


if __name__ == "__main__":
    main()
