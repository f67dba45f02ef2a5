"""Senders name what they report for (X-Gpuscope-Sender), so a hub that sheds them knows whose
silence is its own doing; a malformed name is counted and the request taken as unnamed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from detect.rig import FakeCluster
from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.hub import Hub
from gpuscope.ingest.overload import SENDER_HEADER, OverloadMonitor, OverloadSettings, parse_sender
from gpuscope.ingest.payload import encode_batch
from gpuscope.loadgen.sender import sender_line
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer


@pytest.fixture
def behind() -> Iterator[HubServer]:
    """A real hub with one request in flight and room for one: it sheds every other ingest request."""
    hub = Hub(DuckDBStore(":memory:"))
    hub.overload = OverloadMonitor(OverloadSettings(max_in_flight=1, retry_after_s=1.0))
    srv = HubServer(hub, "127.0.0.1", 0)
    srv.start()
    assert hub.overload.admit(time.time()).ticket is not None  # a request that never ends
    yield srv
    srv.stop()


def test_the_agent_sender_names_its_node_and_the_shedding_hub_holds_it(
    behind: HubServer, tmp_path: Path
) -> None:
    sender = Sender(behind.url, spool=Spool(tmp_path / "spool", fsync=False), sender={"node": "node-0"})
    sender.submit(encode_batch(FakeCluster(nodes=1, gpus=1).batch(time.time(), "node-0")))
    assert sender.backlog == 1  # refused with Retry-After: spooled
    now = time.time()
    cover = behind.hub.overload.cover(now)
    assert list(cover.refused) == [(("node", "node-0"),)] and cover.everyone_until < now


def test_a_malformed_sender_name_is_counted_and_the_request_taken_as_unnamed(behind: HubServer) -> None:
    body = encode_batch(FakeCluster(nodes=1, gpus=1).batch(time.time(), "node-0"))
    reply = httpx.post(
        f"{behind.url}/api/v1/ingest",
        content=body,
        headers={"Content-Type": "application/json", SENDER_HEADER: "gpu=3"},
    )
    assert reply.status_code == 503 and reply.headers["Retry-After"].isdigit()
    assert behind.hub.counters.get("ingest_sender_header_malformed") == 1
    now = time.time()
    assert behind.hub.overload.cover(now).everyone_until > now  # nobody named: every sender's gap


def test_the_load_generator_names_each_stream() -> None:
    for stream, labels in (("node-7", (("node", "node-7"),)), ("sdk:job-1", (("job", "job-1"),))):
        name, _, value = sender_line(stream).decode().rstrip("\r\n").partition(": ")
        assert name == SENDER_HEADER and parse_sender(value) == labels
