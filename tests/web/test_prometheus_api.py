"""Prometheus' read API on the hub (under /prometheus), asked by the real promtool and over HTTP."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscope.model import Batch, Frame
from gpuscope.promql.parse import PromQLError, parse
from hubserve import memory_hub, serve_hub
from support import need_binary

NOW = float(int(time.time()))
T0 = NOW - 600
UTIL = {("n1", "0"): 10.0, ("n1", "1"): 30.0, ("n2", "0"): 50.0, ("n2", "1"): 70.0}


def _batches() -> Iterator[Batch]:
    entities = [{"node": n, "gpu": g} for n, g in UTIL]
    util = np.array(list(UTIL.values()))
    for ts in np.arange(T0, NOW + 1, 5.0):
        energy = np.full(4, 100.0 * (ts - T0))  # a counter growing 100 J/s on every GPU
        values = np.column_stack([util, energy])
        yield Batch(
            "test",
            [Frame(float(ts), ["gpu_utilization_percent", "gpu_energy_joules_total"], entities, values)],
        )


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    with serve_hub(memory_hub(_batches())) as server:
        yield server.url


def _query(url: str, query: str, at: float = NOW) -> dict[str, object]:
    r = httpx.post(f"{url}/prometheus/api/v1/query", data={"query": query, "time": str(at)})
    doc = r.json()
    assert r.status_code == 200 and doc["status"] == "success", doc
    return dict(doc["data"])


def _vector(url: str, query: str) -> dict[str, float]:
    data = _query(url, query)
    assert data["resultType"] == "vector"
    return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in data["result"]}  # type: ignore[attr-defined]


def test_selectors_aggregations_rates_quantiles_and_arithmetic(hub_url: str) -> None:
    by_node = _vector(hub_url, "sum by (node) (gpu_utilization_percent)")
    assert by_node == {'{"node": "n1"}': 40.0, '{"node": "n2"}': 120.0}
    assert _vector(hub_url, "avg(gpu_utilization_percent)") == {"{}": 40.0}
    assert _vector(hub_url, 'gpu_utilization_percent{node="n2",gpu=~"1|2"}') == {
        '{"__name__": "gpu_utilization_percent", "gpu": "1", "node": "n2"}': 70.0
    }
    assert list(_vector(hub_url, "max without (gpu) (gpu_utilization_percent) > 60").values()) == [70.0]
    rates = _vector(hub_url, "rate(gpu_energy_joules_total[1m])")
    assert len(rates) == 4 and all(v == pytest.approx(100.0, rel=0.02) for v in rates.values())
    assert all("__name__" not in k for k in rates)  # functions drop the metric name, as Prometheus does
    total = _vector(hub_url, "sum(rate(gpu_energy_joules_total[2m])) * 2 / 1000")
    assert total["{}"] == pytest.approx(0.8, rel=0.02)
    q = _vector(hub_url, 'quantile_over_time(0.5, gpu_utilization_percent{node="n1", gpu="1"}[5m])')
    assert list(q.values()) == [30.0]
    assert _query(hub_url, "2 * 21")["result"] == [NOW, "42"]
    stale = _query(hub_url, "gpu_utilization_percent", at=NOW + 3600)  # beyond the 5 m lookback
    assert stale["result"] == []


def test_range_query_and_metadata_endpoints(hub_url: str) -> None:
    form = {
        "query": 'avg by (node) (gpu_utilization_percent{node="n1"})',
        "start": T0 + 60,
        "end": NOW,
        "step": "60s",
    }
    data = httpx.get(f"{hub_url}/prometheus/api/v1/query_range", params=form).json()["data"]
    assert data["resultType"] == "matrix"
    (series,) = data["result"]
    assert series["metric"] == {"node": "n1"} and len(series["values"]) == 10
    assert {v for _, v in series["values"]} == {"20"}
    found = httpx.get(
        f"{hub_url}/prometheus/api/v1/series", params={"match[]": 'gpu_utilization_percent{node="n1"}'}
    ).json()["data"]
    assert found == [
        {"__name__": "gpu_utilization_percent", "gpu": "0", "node": "n1"},
        {"__name__": "gpu_utilization_percent", "gpu": "1", "node": "n1"},
    ]
    assert httpx.get(f"{hub_url}/prometheus/api/v1/labels").json()["data"] == ["__name__", "gpu", "node"]
    names = httpx.get(f"{hub_url}/prometheus/api/v1/label/__name__/values").json()["data"]
    assert names == ["gpu_energy_joules_total", "gpu_utilization_percent"]
    assert httpx.get(f"{hub_url}/prometheus/api/v1/label/node/values").json()["data"] == ["n1", "n2"]


def test_queries_outside_the_subset_are_refused_by_position(hub_url: str) -> None:
    for query, words in [
        ("histogram_quantile(0.9, x)", "function 'histogram_quantile' is not supported"),
        ("rate(gpu_energy_joules_total)", "needs a range selector"),
        ("gpu_utilization_percent offset 5m", "at 24: unexpected 'offset'"),
    ]:
        r = httpx.post(f"{hub_url}/prometheus/api/v1/query", data={"query": query})
        assert r.status_code == 400 and r.json()["errorType"] == "bad_data" and words in r.json()["error"]


def test_the_hubs_own_series_route_is_unchanged(hub_url: str) -> None:
    """The Prometheus API lives under /prometheus because the hub's /api/v1/series is another thing."""
    params = {"metric": "gpu_utilization_percent", "node": "n1", "gpu": "1", "start": T0, "end": NOW}
    r = httpx.get(f"{hub_url}/api/v1/series", params=params)
    assert r.status_code == 200 and "status" not in r.json()


def test_promtool_query_instant_and_range(hub_url: str) -> None:
    promtool = need_binary("promtool", "prometheus")
    server = f"{hub_url}/prometheus"
    instant = subprocess.run(
        [
            promtool,
            "query",
            "instant",
            f"--time={NOW:.0f}",
            server,
            "sum by (node) (gpu_utilization_percent)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert instant.returncode == 0, instant.stderr
    assert '{node="n1"} => 40 @' in instant.stdout and '{node="n2"} => 120 @' in instant.stdout
    ranged = subprocess.run(
        [
            promtool,
            "query",
            "range",
            f"--start={NOW - 300:.0f}",
            f"--end={NOW:.0f}",
            "--step=1m",
            server,
            'sum(rate(gpu_energy_joules_total{node="n2"}[1m]))',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ranged.returncode == 0, ranged.stderr
    values = [float(line.split(" @")[0]) for line in ranged.stdout.splitlines() if " @[" in line]
    assert len(values) == 6 and all(v == pytest.approx(200.0, rel=0.02) for v in values), ranged.stdout


HOSTILE = [
    "",
    "sum(",
    ")",
    'x{a=~"("}',
    "1/0",
    "0/0",
    "m{,}",
    "quantile_over_time(2, gpu_utilization_percent[1m])",
    "(" * 2000 + "gpu_utilization_percent" + ")" * 2000,  # before: RecursionError, HTTP 500
    "gpu_utilization_percent+" * 3000 + "gpu_utilization_percent",  # before: RecursionError in evaluation
    "abs(" * 100 + "gpu_utilization_percent" + ")" * 100,
    "9" * 400,
    "x" * 10_000,
]


@pytest.mark.parametrize("query", HOSTILE, ids=lambda q: q[:30])
def test_hostile_queries_are_answered_not_crashed(hub_url: str, query: str) -> None:
    for path, extra in (("query", {}), ("query_range", {"start": NOW - 60, "end": NOW, "step": "10"})):
        r = httpx.post(f"{hub_url}/prometheus/api/v1/{path}", data={"query": query, **extra})
        assert r.status_code in (200, 400), (r.status_code, r.text[:300])
        assert r.json()["status"] in ("success", "error")


@pytest.mark.parametrize("start", ["1e300", "-5", "nan", "inf"])
def test_times_out_of_range_are_bad_data(hub_url: str, start: str) -> None:
    """Before: start=1e300 reached the store and came back as a 503."""
    params = {"query": "gpu_utilization_percent", "start": start, "end": start, "step": "1"}
    r = httpx.get(f"{hub_url}/prometheus/api/v1/query_range", params=params)
    assert r.status_code == 400 and "start" in r.json()["error"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcm_{}()[]=~!\"',.+-*/<>5 0123456789sumrate", max_size=60))
def test_the_parser_raises_only_its_own_error(text: str) -> None:
    with contextlib.suppress(PromQLError):
        parse(text)
