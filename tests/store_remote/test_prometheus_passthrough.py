"""On the remote backend the hub's Prometheus API hands queries to the TSDB (real VictoriaMetrics
and Prometheus), so PromQL beyond gpuscope's own subset works there too."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from gpuscope.hub import Hub
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from store_remote.tsdbs import ReadYourWrites, start_tsdb

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["victoriametrics", "prometheus"])
def test_queries_pass_through_to_the_tsdb(kind: str) -> None:
    db = start_tsdb(kind)
    store = ReadYourWrites(db, DuckDBStore(":memory:"), retry_s=5)
    hub = Hub(store)
    server = HubServer(hub, "127.0.0.1", 0)
    server.start()
    try:
        now = time.time()
        entities = [{"node": "n1", "gpu": "0"}, {"node": "n1", "gpu": "1"}, {"node": "n2", "gpu": "0"}]
        for ts in (now - 20, now - 10, now - 1):
            frame = Frame(ts, ["gpu_utilization_percent"], entities, np.array([[10.0], [30.0], [50.0]]))
            hub.ingest(Batch("test", [frame]))
        url = f"{server.url}/prometheus/api/v1/query"
        doc = httpx.post(url, data={"query": "sum by (node) (gpu_utilization_percent)", "time": now}).json()
        assert doc["status"] == "success" and doc["data"]["resultType"] == "vector"
        got = {s["metric"]["node"]: float(s["value"][1]) for s in doc["data"]["result"]}
        assert got == {"n1": 40.0, "n2": 50.0}
        # topk is not in gpuscope's own subset: answered here only because the TSDB evaluates it
        top = httpx.post(url, data={"query": "topk(1, gpu_utilization_percent)", "time": now}).json()
        assert [s["metric"]["node"] for s in top["data"]["result"]] == ["n2"]
        ranged = httpx.post(
            f"{server.url}/prometheus/api/v1/query_range",
            data={"query": "max(gpu_utilization_percent)", "start": now - 20, "end": now, "step": "5s"},
        ).json()
        assert ranged["data"]["resultType"] == "matrix" and ranged["data"]["result"]
    finally:
        server.stop()
        store.close()
        db.stop()
