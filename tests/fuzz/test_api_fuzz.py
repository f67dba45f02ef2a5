"""Schemathesis on every operation of /openapi.json against the real hub app: no 5xx, documented
statuses and bodies, writes refuse missing or wrong tokens, and every 4xx names the field.

Bounded (a few valid and invalid requests per operation); bench/bench_fuzz.py runs the long one.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

from fuzz.apifuzz import AUTH, fuzz_api, hub_app, registered_operations

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
from gpuscope import __version__
from gpuscope.web.openapi import openapi_document

EXAMPLES = 8


def documented_operations() -> set[tuple[str, str]]:
    paths = openapi_document(__version__)["paths"]
    return {(method.upper(), path) for path, ops in paths.items() for method in ops}


#: documented, but mounted only on hubs that are members of a sharded cluster
CLUSTER_ONLY = {("POST", "/api/v1/cluster/forward")}
#: served under upstream contracts, not gpuscope's own document: the Prometheus HTTP API (tested
#: with promtool and Grafana's panel queries), OTLP/HTTP (tested with the OpenTelemetry SDK's
#: exporters) and the Prometheus text exposition of /metrics (tested with promtool check metrics)
UPSTREAM_CONTRACTS = {
    (method, path)
    for path in (
        "/prometheus/api/v1/query",
        "/prometheus/api/v1/query_range",
        "/prometheus/api/v1/series",
        "/prometheus/api/v1/labels",
        "/prometheus/api/v1/label/{name}/values",
    )
    for method in ("GET", "POST")
} | {("POST", "/v1/metrics"), ("POST", "/v1/traces"), ("GET", "/metrics")}


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    with hub_app() as app:
        served = registered_operations(app) - UPSTREAM_CONTRACTS
        assert served == documented_operations() - CLUSTER_ONLY


def test_fuzz_every_operation() -> None:
    with hub_app() as app:
        report = fuzz_api(app, EXAMPLES)
    fuzzed = {tuple(label.split(" ", 1)) for label in report.operations}
    # the document itself is the one operation schemathesis reads rather than fuzzes
    assert fuzzed == documented_operations() - {("GET", "/openapi.json")}
    assert not report.failures, "\n\n".join(report.failures)
    assert all(report.requests[op] > 0 for op in report.operations), report.requests
    # both valid requests (2xx) and refusals (4xx) were exercised
    assert any(200 <= s < 300 for s in report.statuses) and any(400 <= s < 500 for s in report.statuses)
    assert not [s for s in report.statuses if s >= 500]
    print(f"\nfuzzed {len(report.operations)} operations with {report.total} requests: {report.statuses}")


#: what the fuzzing found (each was a 500 or a refusal naming no field), kept as fixed examples
FOUND = [
    ("GET", "/api/v1/aggregate?by=node&metric=m&start=-1.8e305&end=0", None, 400, "start"),
    ("GET", "/api/v1/aggregate?by=node&metric=m&start=1&end=0", None, 400, "start"),
    ("GET", "/api/v1/events?=x", None, 400, "query"),
    ("GET", "/api/v1/series?metric=m&bad-label=x", None, 400, "bad-label"),
    ("GET", "/api/v1/events?limit=%C2%B2", None, 400, "limit"),
    ("POST", "/api/v1/ingest", {"": None}, 400, "body"),
    ("POST", "/api/v1/lineage/runs", {"job": "j", "started_at": []}, 400, "started_at"),
    (
        "POST",
        "/api/v1/lineage/checkpoints",
        {"job": "j", "manifest_hash": "0" * 8, "step": 2**63},
        400,
        "step",
    ),
    (
        "POST",
        "/api/v1/lineage/versions",
        {"model": "m", "version": "v", "job": "j", "step": "x"},
        400,
        "step",
    ),
    ("GET", "/api/v1/lineage/versions/a%0Ab/v1", None, 404, "path"),
]


@pytest.mark.parametrize(("method", "url", "body", "status", "field"), FOUND)
def test_what_fuzzing_found_is_refused_by_name(
    method: str, url: str, body: Any, status: int, field: str
) -> None:
    with hub_app() as app:
        r = TestClient(app).request(method, url, json=body, headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (status, field), r.text


def test_unknown_routes_answer_json_naming_the_path() -> None:
    with hub_app() as app:
        client = TestClient(app)
        r = client.get("/api/v1/lineage/versions/a%0Ab/v1")
        assert r.status_code == 404 and r.json()["field"] == "path", r.text
        r = client.put("/api/v1/ingest")
        assert r.status_code in (401, 405) and re.fullmatch(r"\w+", r.json()["field"]), r.text
