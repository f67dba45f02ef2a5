"""The agent's Prometheus ``/metrics`` endpoint, so teams can scrape it with the Prometheus they run.

Every round replaces what is exposed (a GPU that vanished stops being exposed rather than going
stale). Names and help texts come from :mod:`gpuscope.signals`; counters keep their ``_total``
names. The standard label ``job`` is exposed as is: scrape with ``honor_labels: true`` to keep
it, or Prometheus files it as ``exported_job``.
"""

from __future__ import annotations

import math
import re
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuscope.collect.base import Collected, Collector, CollectorSet
from gpuscope.counters import Counters
from gpuscope.model import Frame
from gpuscope.signals import ALL_METRICS
from gpuscope.tls import TlsSettings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_VALID = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def render_exposition(frames: Sequence[Frame]) -> str:
    """Text exposition 0.0.4 of the latest value of every series in ``frames``."""
    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for f in frames:
        keys = [tuple(sorted(labels.items())) for labels in f.entities]
        for j, metric in enumerate(f.metrics):
            if not _VALID.fullmatch(metric):
                continue
            col = f.values[:, j]
            by_labels = series.setdefault(metric, {})
            for i, key in enumerate(keys):
                v = float(col[i])
                if not math.isnan(v):
                    by_labels[key] = v
    lines: list[str] = []
    for metric in sorted(series):
        if not series[metric]:
            continue
        spec = ALL_METRICS.get(metric)
        kind = spec.kind if spec else "gauge"
        lines.append(f"# HELP {metric} {_escape(spec.help) if spec else 'gpuscope metric.'}")
        lines.append(f"# TYPE {metric} {kind}")
        for key, v in sorted(series[metric].items()):
            label_text = ",".join(f'{k}="{_escape(val)}"' for k, val in key if _VALID.fullmatch(k))
            lines.append(f"{metric}{{{label_text}}} {_number(v)}" if label_text else f"{metric} {_number(v)}")
    return "\n".join(lines) + "\n"


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError | TimeoutError):
            return  # a client that failed the TLS handshake (plain HTTP, unknown CA) or went away
        super().handle_error(request, client_address)


class MetricsEndpoint:
    """A small HTTP server on ``host:port`` answering ``GET /metrics`` with the latest round."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: TlsSettings | None = None) -> None:
        self._lock = threading.Lock()
        self._body = b""
        self.rounds = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 30  # a connection that never finishes its request (or handshake) is dropped

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = endpoint.body()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # scrapes every few seconds would flood the agent's log

        context = tls.server_context() if tls is not None else None  # before binding: ValueError
        self.server = _Server((host, port), Handler)
        self.server.daemon_threads = True
        if context is not None:
            # the handshake runs in each connection's own thread, so a slow client cannot stall accept
            self.server.socket = context.wrap_socket(
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.tls = tls
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="gpuscope-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsEndpoint:
        self._thread.start()
        return self

    def publish(self, collected: Collected) -> None:
        body = render_exposition(collected.frames).encode()
        with self._lock:
            self._body = body
            self.rounds += 1

    def body(self) -> bytes:
        with self._lock:
            return self._body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PublishingCollectorSet(CollectorSet):
    """A :class:`CollectorSet` whose every round is also published on a :class:`MetricsEndpoint`."""

    def __init__(
        self, collectors: Sequence[Collector], endpoint: MetricsEndpoint, counters: Counters | None = None
    ) -> None:
        super().__init__(collectors, counters)
        self.endpoint = endpoint

    def collect(self, now: float) -> Collected:
        got = super().collect(now)
        self.endpoint.publish(got)
        return got


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9470`` for IPv6); a clear ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-listen must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def serve_only(cs: CollectorSet, interval: float, stop: threading.Event) -> None:
    """Collect every ``interval`` seconds (aligned) for the endpoint alone, until ``stop``."""
    while not stop.is_set():
        now = time.time()
        tick = (math.floor(now / interval) + 1) * interval
        if stop.wait(tick - now):
            break
        cs.collect(tick)
