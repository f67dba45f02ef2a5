"""The hub's own /metrics: what it ingested, refused, its lag, detection cost, outbox; promtool accepts it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.hub import Hub
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import need_binary

TOKEN = "a-test-token-of-enough-length"


@pytest.fixture
def server() -> Iterator[HubServer]:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    service = AlertingService(hub, parse_alerting({}))
    served = HubServer(hub, "127.0.0.1", 0, tokens=[TOKEN], alerting=service)
    service.start()
    served.start()
    yield served
    served.stop()
    service.stop()


def _frame(ts: float) -> Frame:
    labels = [{"node": "n1", "gpu": str(i)} for i in range(4)]
    return Frame(ts, ["gpu_utilization_percent", "gpu_temp_celsius"], labels, np.full((4, 2), 50.0))


def test_hub_metrics_count_ingest_refusals_lag_and_pass_promtool(server: HubServer) -> None:
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    sent_at = time.time() - 2.0  # the batch is two seconds old when it arrives
    body = encode_batch(Batch(source="test", frames=[_frame(sent_at)]))
    assert httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=auth).status_code == 200
    assert httpx.post(f"{server.url}/api/v1/ingest", content=b"{not json", headers=auth).status_code == 400
    assert httpx.post(f"{server.url}/api/v1/ingest", content=body).status_code == 401
    response = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    text = response.text
    assert 'gpuscope_hub_ingested_total{kind="samples"} 8.0' in text
    assert 'gpuscope_hub_ingested_total{kind="batches"} 1.0' in text
    assert 'gpuscope_hub_refused_total{reason="auth_refused_401"} 1.0' in text
    assert 'gpuscope_hub_refused_total{reason="ingest_rejected_batches"} 1.0' in text
    lag = float(text.split("\ngpuscope_hub_ingest_lag_seconds ", 1)[1].split("\n", 1)[0])
    assert 2.0 <= lag < 30.0
    cost = float(text.split("\ngpuscope_hub_detection_seconds_total ", 1)[1].split("\n", 1)[0])
    assert cost > 0.0
    assert 'gpuscope_hub_outbox_notifications{state="pending"} 0.0' in text
    assert "gpuscope_hub_store_rows{" in text
    promtool = need_binary("promtool", "prometheus")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_metrics_need_a_read_token_off_loopback_rules(server: HubServer) -> None:
    """The same scope as every other read: a wrong token is refused."""
    assert (
        httpx.get(f"{server.url}/metrics", headers={"authorization": "Bearer wrong-token-x"}).status_code
        == 403
    )


def _gauges(text: str, family: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(family + "{") or line.startswith(family + " "):
            name, _, value = line.rpartition(" ")
            out[name[len(family) :]] = float(value)
    return out


def test_hub_metrics_say_where_the_memory_is(server: HubServer) -> None:
    """Issue 13 (d): DuckDB's memory by tag, the Python heap, malloc's arenas and the hub's
    structures are gauges, so an operator (and the soak bench) can see which part grows."""
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    for i in range(5):
        body = encode_batch(Batch(source="node-a", frames=[_frame(time.time() - 5 + i)], batch_id=f"b{i}"))
        assert httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=auth).status_code == 200
    server.hub.settle()
    text = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    duck = _gauges(text, "gpuscope_hub_store_memory_bytes")
    assert '{tag="BASE_TABLE"}' in duck and sum(duck.values()) > 0
    # DuckDB's jemalloc (outside both accounts above): what it uses and what it keeps freed
    jemalloc = _gauges(text, "gpuscope_hub_store_allocator_bytes")
    assert jemalloc['{state="allocated"}'] > 0 and '{state="dirty"}' in jemalloc
    assert jemalloc['{state="resident"}'] >= jemalloc['{state="active"}']
    assert _gauges(text, "gpuscope_hub_process_resident_bytes")[""] > 10 * 2**20
    assert _gauges(text, "gpuscope_hub_process_python_blocks")[""] > 1000
    assert _gauges(text, "gpuscope_hub_process_malloc_bytes")['{state="in_use"}'] > 0
    # the interpreter's own arenas and the threads' stacks: the rest of the resident set's owners
    pymalloc = _gauges(text, "gpuscope_hub_process_pymalloc_bytes")
    assert 0 < pymalloc['{state="in_use"}'] <= pymalloc['{state="arenas"}']
    assert pymalloc['{state="in_use"}'] + pymalloc['{state="free"}'] == pymalloc['{state="arenas"}']
    assert _gauges(text, "gpuscope_hub_process_threads")[""] >= 2
    assert set(_gauges(text, "gpuscope_hub_process_gc_objects")) == {
        '{generation="0"}',
        '{generation="1"}',
        '{generation="2"}',
    }
    assert _gauges(text, "gpuscope_hub_store_batch_ids_remembered")[""] == 5.0
    structures = _gauges(text, "gpuscope_hub_structure_entries")
    assert '{structure="observe_stage"}' in structures and '{structure="alert_state"}' in structures
    assert sum(v for k, v in structures.items() if k.startswith('{structure="detector.')) > 0
