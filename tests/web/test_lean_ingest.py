"""The lean ingest path (served from the HTTP parser's callbacks) against the ASGI path, over real
sockets: the same requests to two hubs, one serving ingest each way, get the same bytes back
(status line, headers in order, body; only the ``date`` value may differ), count the same, and
store and show the detectors the same batches."""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from gpuscope.hub import Hub
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_TYPE
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.overload import OverloadMonitor, OverloadSettings
from gpuscope.ingest.payload import Limits, parse_batch
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.auth import INGEST, READ, AuthSettings, RateLimit, Token, digest
from gpuscope.web.lean_ingest import LeanHttpProtocol
from gpuscope.web.server import HubServer
from support import wait_until

AGENT = "agent-token-0123456789"
READER = "reader-token-0123456789"
LIMITED = "limited-token-0123456789"
LIMIT = 4096
_DATE = re.compile(rb"^date: [^\r]*\r\n", re.MULTILINE)


def auth() -> AuthSettings:
    return AuthSettings(
        tokens=[
            Token("agent", frozenset({INGEST}), digest(AGENT)),
            Token("reader", frozenset({READ}), digest(READER)),
            Token("limited", frozenset({INGEST}), digest(LIMITED)),
        ],
        token_limits={"limited": RateLimit(rate=0.001, burst=1.0)},
    )


@dataclass
class Served:
    server: HubServer
    seen: list[Batch]  # what the hub's observers (the detectors' stage) were shown

    @property
    def hub(self) -> Hub:
        return self.server.hub


def serve(lean: bool) -> Served:
    hub = Hub(DuckDBStore(":memory:"))
    # the same shed delay on both hubs: Retry-After is drawn from the monitor's generator
    hub.overload = OverloadMonitor(OverloadSettings(retry_after_s=1.0), rng=random.Random(7))
    seen: list[Batch] = []
    hub.add_observer(seen.append)
    server = HubServer(
        hub,
        "127.0.0.1",
        0,
        auth=auth(),
        limits=Limits(max_body_bytes=LIMIT),
        evaluate_interval=None,
        lean_ingest=lean,
    )
    server.start()
    return Served(server, seen)


@pytest.fixture
def pair() -> Iterator[tuple[Served, Served]]:
    lean, asgi = serve(True), serve(False)
    yield lean, asgi
    lean.server.stop()
    asgi.server.stop()


def batch_doc(node: str, k: int, now: float) -> dict[str, Any]:
    return {
        "source": node,
        "batch_id": f"{node}-{k}",
        "frames": [
            {
                "ts": now - 1.0,
                "metrics": ["gpu_utilization_percent", "gpu_memory_used_bytes"],
                "entities": [{"node": node, "gpu": "0"}, {"node": node, "gpu": "1"}],
                "values": [[50.0 + k, 1e9], [60.0 + k, 2e9]],
            }
        ],
    }


def post(
    body: bytes, *, ctype: str | None = "application/json", token: str | None = AGENT, extra: str = ""
) -> bytes:
    lines = ["POST /api/v1/ingest HTTP/1.1", "Host: hub"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    lines.append(f"Content-Length: {len(body)}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _one(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first whole response in ``buf`` (its ``date`` value blanked) and what follows it."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[: end + 4]
    length = re.search(rb"^content-length: (\d+)\r\n", head, re.MULTILINE | re.IGNORECASE)
    n = int(length.group(1)) if length else 0
    if len(buf) < end + 4 + n:
        return None
    return _DATE.sub(b"date: -\r\n", head) + buf[end + 4 : end + 4 + n], buf[end + 4 + n :]


def exchange(port: int, raw: bytes, answers: int = 1) -> tuple[list[bytes], bool]:
    """Send ``raw`` on one connection; the ``answers`` responses, and whether the hub then closed
    the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        buf, out = b"", []
        while len(out) < answers:
            found = _one(buf)
            if found is None:
                chunk = sock.recv(65536)
                assert chunk, f"the hub closed the connection after {len(out)} answers: {buf!r}"
                buf += chunk
                continue
            response, buf = found
            out.append(response)
        sock.settimeout(0.3)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
        return out, closed


def same(pair: tuple[Served, Served], raw: bytes, answers: int = 1) -> list[bytes]:
    """Both hubs' answers to ``raw``, asserted identical; the lean hub's."""
    lean, asgi = pair
    got_lean = exchange(lean.server.port, raw, answers)
    got_asgi = exchange(asgi.server.port, raw, answers)
    assert got_lean == got_asgi
    return got_lean[0]


def status_and_body(response: bytes) -> tuple[int, Any]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body) if body.startswith(b"{") else body


def test_one_hub_serves_ingest_on_the_lean_path_the_other_on_the_asgi_path(
    pair: tuple[Served, Served],
) -> None:
    lean, asgi = pair
    assert not issubclass(asgi.server.server.config.http, LeanHttpProtocol)  # type: ignore[arg-type]
    with socket.create_connection(("127.0.0.1", lean.server.port), timeout=10) as sock:
        sock.sendall(post(b"{}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        [connection] = lean.server.server.server_state.connections
        assert isinstance(connection, LeanHttpProtocol) and connection.lean_on


def test_acknowledgements_are_the_same_bytes_and_store_the_same(pair: tuple[Served, Served]) -> None:
    now = time.time()
    as_json = orjson.dumps(batch_doc("node-0", 0, now))
    [ack] = same(pair, post(as_json))
    assert status_and_body(ack) == (
        200,
        {
            "accepted": {"samples": 4, "events": 0, "training": 0},
            "refused": {"entities": 0, "samples": 0},
            "duplicate": False,
            "notes": [],
        },
    )
    assert ack.startswith(b"HTTP/1.1 200 OK\r\ndate: -\r\ncontent-length: ")
    as_frame = encode_frame(parse_batch(batch_doc("node-1", 0, now)))
    [ack] = same(pair, post(as_frame, ctype=FRAME_TYPE))
    assert status_and_body(ack)[1]["accepted"]["samples"] == 4
    [again] = same(pair, post(as_frame, ctype=FRAME_TYPE))  # the sender retried: not stored twice
    assert status_and_body(again)[1]["duplicate"] is True

    lean, asgi = pair
    for served in pair:
        served.hub.settle()
    for name in ("ingest_batches", "ingest_samples", "ingest_duplicate_batches"):
        assert lean.hub.counters.get(name) == asgi.hub.counters.get(name) > 0, name
    seen = [[(b.source, b.batch_id, [f.values.tolist() for f in b.frames]) for b in s.seen] for s in pair]
    assert seen[0] == seen[1] and len(seen[0]) == 2  # the detectors saw each batch once, alike
    snapshots = [sorted(orjson.dumps(row) for row in s.hub.store.snapshot()) for s in pair]
    assert snapshots[0] == snapshots[1] and len(snapshots[0]) == 4
    metrics = [_ingest_metrics(s) for s in pair]
    assert metrics[0] == metrics[1]
    assert 'gpuscope_hub_ingested_total{kind="samples"} 8.0' in metrics[0]


def _ingest_metrics(served: Served) -> list[str]:
    text = httpx.get(f"{served.server.url}/metrics", headers={"Authorization": f"Bearer {READER}"}).text
    return [
        line
        for line in text.splitlines()
        if line.startswith(("gpuscope_hub_ingested", "gpuscope_hub_refused"))
    ]


@pytest.mark.parametrize(
    ("what", "raw", "status", "field"),
    [
        ("bad JSON field", orjson.dumps({"source": "n", "frames": [{"ts": 1.0}]}), 400, "frames[0].metrics"),
        ("not JSON", b"{nope", 400, "body"),
        ("bad frame", b"GSF\x01 not a frame", 400, "header"),
        ("gzip body (not an encoding ingest takes)", b"\x1f\x8b\x08\x00junk", 400, "body"),
    ],
)
def test_refusals_of_bad_bodies_name_the_field_alike(
    pair: tuple[Served, Served], what: str, raw: bytes, status: int, field: str
) -> None:
    ctype = FRAME_TYPE if what == "bad frame" else "application/json"
    extra = "Content-Encoding: gzip" if what.startswith("gzip") else ""
    [answer] = same(pair, post(raw, ctype=ctype, extra=extra))
    got_status, doc = status_and_body(answer)
    assert got_status == status
    assert doc["field"] == field and doc["error"]
    lean, asgi = pair
    assert lean.hub.counters.get("api_refused_400") == asgi.hub.counters.get("api_refused_400") == 1


def test_auth_refusals_are_the_same_bytes(pair: tuple[Served, Served]) -> None:
    body = orjson.dumps(batch_doc("node-0", 0, time.time()))
    [missing] = same(pair, post(body, token=None))
    assert status_and_body(missing)[0] == 401 and b"www-authenticate: Bearer\r\n" in missing
    [invalid] = same(pair, post(body, token="not-a-valid-token-at-all"))
    assert status_and_body(invalid) == (403, {"error": "the token is not valid", "field": "authorization"})
    [no_scope] = same(pair, post(body, token=READER))
    assert status_and_body(no_scope)[1]["error"] == "token 'reader' lacks the scope 'ingest' this needs"
    lean, asgi = pair
    for name in ("auth_refused_401", "auth_refused_403", "ingest_batches"):
        assert lean.hub.counters.get(name) == asgi.hub.counters.get(name), name


def test_rate_limit_refusal_with_retry_after(pair: tuple[Served, Served]) -> None:
    now = time.time()
    first = same(pair, post(orjson.dumps(batch_doc("node-0", 0, now)), token=LIMITED))
    assert status_and_body(first[0])[0] == 200
    [limited] = same(pair, post(orjson.dumps(batch_doc("node-0", 1, now)), token=LIMITED))
    assert status_and_body(limited)[0] == 429 and b"\r\nretry-after: 1000\r\n" in limited


def test_wrong_type_and_oversize_are_refused_alike(pair: tuple[Served, Served]) -> None:
    body = orjson.dumps(batch_doc("node-0", 0, time.time()))
    [wrong] = same(pair, post(body, ctype="text/plain"))
    assert status_and_body(wrong)[0] == 415 and status_and_body(wrong)[1]["field"] == "content-type"
    [declared] = same(pair, post(b"x" * (LIMIT + 1)))
    assert status_and_body(declared)[1] == {
        "error": f"{LIMIT + 1} bytes is over the limit of {LIMIT}",
        "field": "body",
    }
    [bad_length] = same(pair, post(body).replace(b"Content-Length: ", b"Content-Length: +"))
    assert status_and_body(bad_length)[0] in (400, 413) or bad_length.startswith(b"HTTP/1.1 400")
    # no Content-Length: the body is counted as it arrives
    chunk = b"x" * (LIMIT // 2 + 1)
    chunked = (
        b"POST /api/v1/ingest HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer " + AGENT.encode() + b"\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2 + b"0\r\n\r\n"
    )
    [streamed] = same(pair, chunked)
    assert status_and_body(streamed)[1] == {"error": f"over the limit of {LIMIT} bytes", "field": "body"}
    lean, asgi = pair
    assert (
        lean.hub.counters.get("ingest_refused_too_large")
        == asgi.hub.counters.get("ingest_refused_too_large")
        == 2
    )


def test_overload_refusal_with_retry_after(pair: tuple[Served, Served]) -> None:
    for served in pair:  # an evaluation ran far behind: the hub sheds ingest until it settles
        served.hub.overload.evaluated(time.time(), 60.0)
    [shed] = same(pair, post(orjson.dumps(batch_doc("node-0", 0, time.time()))))
    assert status_and_body(shed)[0] == 503 and re.search(rb"\r\nretry-after: [12]\r\n", shed)
    lean, asgi = pair
    assert lean.hub.counters.get("ingest_shed_requests") == asgi.hub.counters.get("ingest_shed_requests") == 1
    assert lean.hub.counters.get("ingest_batches") == 0


def test_pipelined_requests_on_one_connection_are_answered_in_order(pair: tuple[Served, Served]) -> None:
    now = time.time()
    good = [orjson.dumps(batch_doc("node-0", k, now)) for k in range(3)]
    raw = (
        post(good[0])
        + post(b"{nope")
        + b"GET /nowhere HTTP/1.1\r\nHost: hub\r\n\r\n"  # the ASGI path, between lean requests
        + post(good[1], ctype="text/plain")
        + post(good[2])
    )
    answers = same(pair, raw, answers=5)
    assert [status_and_body(a)[0] for a in answers] == [200, 400, 404, 415, 200]
    assert not any(b"connection: close" in a for a in answers)
    # the last request asks to close: the answer says so and the hub closes
    (last,), closed = exchange(pair[0].server.port, post(good[0], extra="Connection: close"))
    assert last.split(b"\r\n\r\n")[0].endswith(b"connection: close") and closed
    assert exchange(pair[1].server.port, post(good[0], extra="Connection: close")) == ([last], True)


def test_a_sender_gone_mid_body_is_counted_alike(pair: tuple[Served, Served]) -> None:
    for served in pair:
        with socket.create_connection(("127.0.0.1", served.server.port)) as sock:
            sock.sendall(post(b"x" * 1000)[:-900])
            time.sleep(0.2)  # the hub waits for the rest of the body when the sender goes away
    lean, asgi = pair
    for counters in (lean.hub.counters, asgi.hub.counters):
        wait_until(lambda c=counters: c.get("ingest_client_disconnects") == 1, 10, "the disconnect counted")
    for name in ("ingest_client_disconnects", "api_refused_499", "ingest_batches"):
        assert lean.hub.counters.get(name) == asgi.hub.counters.get(name), name
    assert lean.hub.counters.get("ingest_client_disconnects") == 1
    # nothing is left in flight: the hub is not taken to be behind
    assert lean.hub.overload.status(time.time())["in_flight"] == 0


@pytest.mark.parametrize("lean", [True, False])
def test_a_hub_told_to_stop_still_answers_the_batch_it_is_storing(
    lean: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = serve(lean)
    hub = served.hub
    real = hub.ingest_then

    def slow_sync(batch: Batch, durable: Any) -> bool:  # the ingest log's sync takes a while
        return real(batch, lambda outcome: threading.Timer(0.5, durable, (outcome,)).start())

    monkeypatch.setattr(hub, "ingest_then", slow_sync)
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=10) as sock:
        sock.sendall(post(orjson.dumps(batch_doc("node-0", 0, time.time()))))
        wait_until(lambda: hub.overload.status(time.time())["in_flight"] == 1, 10, "the batch in flight")
        stopping = threading.Thread(target=served.server.stop)
        stopping.start()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        stopping.join()
    # acknowledged once durable, and the connection closed after it: the sender need not resend
    assert status_and_body(answer)[0] == 200
    assert b"\r\nconnection: close\r\n" in answer.split(b"\r\n\r\n")[0] + b"\r\n"
    assert hub.counters.get("ingest_batches") == 1
