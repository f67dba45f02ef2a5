"""The hub's real HTTP server on ingest: C parser and loop, and senders that vanish mid-body."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.http_protocol import HttpProtocol
from gpuscope.web.server import HubServer
from support import wait_until


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server() -> Iterator[HubServer]:
    srv = HubServer(Hub(DuckDBStore(":memory:")), "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def test_server_uses_the_c_http_parser_and_loop(server: HubServer) -> None:
    # httptools' parser, each answer one write (ingest served from its callbacks: lean_ingest)
    assert issubclass(server.server.config.http, HttpProtocol)  # type: ignore[arg-type]
    assert server.server.config.loop == "uvloop"


def test_client_gone_mid_body_is_counted_without_a_traceback(server: HubServer) -> None:
    seen = _Records()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(seen)
    try:
        with socket.create_connection((server.host, server.port)) as sock:
            sock.sendall(
                b"POST /api/v1/ingest HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
                b"Content-Length: 5000\r\n\r\n" + b'{"source": "node-0", "frames": ['
            )
            time.sleep(0.1)  # the handler is reading the body when the sender goes away
        counters = server.hub.counters
        wait_until(lambda: counters.get("ingest_client_disconnects") == 1, 10, "the disconnect counted")
    finally:
        uvicorn_log.removeHandler(seen)
    assert [r.getMessage() for r in seen.records if r.levelno >= logging.WARNING or r.exc_info] == []
    assert server.hub.counters.get("ingest_batches") == 0
    # the server carries on: the next sender's batch is stored
    reply = httpx.post(
        f"{server.url}/api/v1/ingest",
        content=orjson.dumps(
            {
                "source": "node-0",
                "frames": [
                    {
                        "ts": time.time(),
                        "metrics": ["gpu_utilization_percent", "gpu_temp_celsius"],
                        "entities": [{"node": "node-0", "gpu": "0"}, {"node": "node-0", "gpu": "1"}],
                        "values": [[90.0, 60.0], [91.0, 61.0]],
                    }
                ],
            }
        ),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["accepted"]["samples"] == 4


def test_the_hub_answers_through_its_protocol_in_one_piece(server: HubServer) -> None:
    body = orjson.dumps({"source": "node-0", "frames": []})
    request = (
        b"POST /api/v1/ingest HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(request)
        sock.settimeout(10)
        first = sock.recv(1 << 16)  # headers and body written together, so they arrive together
    head, _, rest = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert orjson.loads(rest)["accepted"]["samples"] == 0
    assert httpx.get(f"{server.url}/api/v1/health").json()["status"] == "ok"
