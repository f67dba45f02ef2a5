"""Every panel query and template variable of the shipped Grafana dashboards, run against a hub."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gpuscope.model import Batch, Frame
from hubserve import memory_hub, serve_hub

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
NOW = float(int(time.time()))
VALUES = {"job": "pretrain", "service": "chat"}
# what Grafana puts in place of its own variables before it sends a query
GRAFANA_VARS = {"$__rate_interval": "2m", "$__interval": "1m", "$__range": "30m"}

GPU = {
    "gpu_utilization_percent": 80.0,
    "gpu_temp_celsius": 70.0,
    "gpu_power_watts": 400.0,
    "gpu_memory_used_bytes": 40e9,
    "gpu_memory_total_bytes": 80e9,
    "gpu_sm_clock_mhz": 1980.0,
}
SERVICE = {
    "inference_requests_per_second": 50.0,
    "inference_errors_per_second": 0.5,
    "inference_latency_p95_seconds": 0.4,
    "inference_ttft_p95_seconds": 0.1,
    "inference_queue_depth": 3.0,
    "inference_kv_cache_usage_ratio": 0.5,
}


def _batches() -> Iterator[Batch]:
    gpus = [{"node": f"node-{n}", "gpu": str(g), "job": "pretrain"} for n in range(2) for g in range(2)]
    for ts in np.arange(NOW - 2400, NOW + 1, 10.0):
        counters = {"gpu_energy_joules_total": 400.0 * (ts - NOW + 2400), "gpu_ecc_dbe_volatile_total": 0.0}
        names = [*GPU, *counters]
        values = np.tile([*GPU.values(), *counters.values()], (len(gpus), 1))
        values[-1, 0] = 2.0  # one idle GPU, for the idle-GPU panel
        service = Frame(
            float(ts),
            list(SERVICE),
            [{"service": "chat", "node": "node-0"}],
            np.array([list(SERVICE.values())]),
        )
        yield Batch("test", [Frame(float(ts), names, gpus, values), service])


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    with serve_hub(memory_hub(_batches())) as server:
        yield server.url


def _expand(expr: str) -> str:
    for name, value in {**GRAFANA_VARS, **{f"${k}": v for k, v in VALUES.items()}}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable left in {expr!r}"
    return expr


def _panels(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["panels"])


def test_three_dashboards_fleet_job_service() -> None:
    assert [p.stem for p in DASHBOARDS] == ["fleet", "job", "service"]
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)) and doc["uid"].startswith("gpuscope-")
        assert doc["templating"]["list"][0]["type"] == "datasource"


@pytest.mark.parametrize(
    ("path", "target"),
    [(p, t) for p in DASHBOARDS for panel in _panels(p) for t in panel["targets"]],
    ids=lambda v: v.stem if isinstance(v, Path) else v["expr"][:60],
)
def test_every_panel_query_answers(hub_url: str, path: Path, target: dict[str, Any]) -> None:
    form = {"query": _expand(target["expr"]), "start": NOW - 1800, "end": NOW, "step": 60}
    r = httpx.post(f"{hub_url}/prometheus/api/v1/query_range", data=form)
    doc = r.json()
    assert r.status_code == 200 and doc["status"] == "success", (path.name, doc)
    series = doc["data"]["result"]
    assert series and all(s["values"] for s in series), (path.name, target["expr"])
    for s in series:  # the legend names labels the result carries
        for label in re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")):
            assert label in s["metric"], (target["expr"], label)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_template_variables_list_their_values(hub_url: str, path: Path) -> None:
    for var in json.loads(path.read_text())["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"]).groups()  # type: ignore[union-attr]
        r = httpx.get(f"{hub_url}/prometheus/api/v1/label/{label}/values", params={"match[]": metric})
        assert VALUES[var["name"]] in r.json()["data"]
