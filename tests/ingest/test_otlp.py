"""OTLP/HTTP metrics from the real OpenTelemetry SDK and exporter, into gpuscope's inference signals."""

from __future__ import annotations

import gzip
import math
import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gpuscope.hub import Hub
from gpuscope.ingest.otlp import histogram_quantile
from gpuscope.ingest.payload import Limits
from gpuscope.web.server import HubServer
from hubserve import memory_hub, serve_hub

TOKEN = "an-ingest-token-of-enough-length"
BOUNDS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]


@pytest.fixture
def served() -> Iterator[tuple[HubServer, Hub]]:
    hub = memory_hub()
    with serve_hub(hub, tokens=[TOKEN], limits=Limits(max_past_s=7 * 86400)) as server:
        yield server, hub


def _provider(url: str, compression: Compression = Compression.NoCompression) -> MeterProvider:
    exporter = OTLPMetricExporter(
        endpoint=f"{url}/v1/metrics", headers={"authorization": f"Bearer {TOKEN}"}, compression=compression
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)  # flushed by hand
    resource = Resource.create({"service.name": "chat", "host.name": "node-7"})
    return MeterProvider(metric_readers=[reader], resource=resource)


def _latest(hub: Hub) -> dict[str, float]:
    (row,) = [r for r in hub.store.snapshot(None, None) if r["labels"].get("service") == "chat"]
    assert row["labels"] == {"service": "chat", "node": "node-7"}
    return dict(row["values"])


def test_sdk_histograms_become_rates_and_quantiles(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    provider = _provider(server.url)
    meter = provider.get_meter("inference-server")
    duration = meter.create_histogram(
        "gen_ai.server.request.duration", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    ttft = meter.create_histogram(
        "gen_ai.server.time_to_first_token", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    tpot = meter.create_histogram(
        "gen_ai.server.time_per_output_token", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    other = meter.create_counter("app.cache.hits")  # not an inference signal: acknowledged, counted
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.system": "vllm", "gen_ai.request.model": "m"}
    for i in range(100):
        duration.record(0.15 if i < 90 else 1.5, attrs)  # 90 fast, 10 slow
        ttft.record(0.03, attrs)
        tpot.record(0.015, attrs)
    for _ in range(5):
        duration.record(0.15, {**attrs, "error.type": "timeout"})
    other.add(3)
    time.sleep(0.05)  # a rate needs an interval (under a millisecond is not one)
    assert provider.force_flush(10_000)
    first = _latest(hub)
    assert first["inference_latency_p50_seconds"] == pytest.approx(0.1 + 0.1 * (52.5 / 95), rel=1e-6)
    assert 1.0 < first["inference_latency_p95_seconds"] <= 2.0
    assert 0.02 < first["inference_ttft_p95_seconds"] <= 0.05
    assert 0.01 < first["inference_itl_p50_seconds"] <= 0.02
    assert first["inference_requests_per_second"] > 0
    assert first["inference_errors_per_second"] == pytest.approx(
        first["inference_requests_per_second"] * 5 / 105
    )
    assert hub.counters.get("otlp_points_unmapped") >= 1

    # the SDK exports cumulative histograms: the second export's rates cover only what came since
    time.sleep(0.5)
    for _ in range(20):
        duration.record(0.15, attrs)
    started = time.monotonic()
    assert provider.force_flush(10_000)
    second = _latest(hub)
    assert second["inference_latency_p95_seconds"] <= 0.2  # the slow ten belong to the first window
    assert second["inference_errors_per_second"] == 0.0
    assert 20 / (time.monotonic() - started + 2.0) < second["inference_requests_per_second"] < 20 / 0.4
    provider.shutdown()


def test_gzip_export_and_the_http_histogram(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    provider = _provider(server.url, Compression.Gzip)
    meter = provider.get_meter("web")
    http = meter.create_histogram(
        "http.server.request.duration", unit="s", explicit_bucket_boundaries_advisory=BOUNDS
    )
    for status in [200] * 8 + [503] * 2:
        http.record(0.3, {"http.request.method": "POST", "http.response.status_code": status})
    time.sleep(0.05)  # a rate needs an interval (under a millisecond is not one)
    assert provider.force_flush(10_000)
    values = _latest(hub)
    assert values["inference_errors_per_second"] == pytest.approx(
        values["inference_requests_per_second"] * 0.2
    )
    assert 0.2 < values["inference_latency_p50_seconds"] <= 0.5
    provider.shutdown()


def test_refusals_name_what_was_wrong(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    url = f"{server.url}/v1/metrics"
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/x-protobuf"}
    assert (
        httpx.post(url, content=b"\x00", headers={"content-type": "application/x-protobuf"}).status_code
        == 401
    )
    bad = httpx.post(url, content=b"\xff\xff\xff", headers=auth)
    assert bad.status_code == 400 and "not an OTLP metrics export" in bad.json()["error"]
    zipped = httpx.post(url, content=b"plain", headers={**auth, "content-encoding": "gzip"})
    assert zipped.status_code == 400 and "gzip" in zipped.json()["error"]
    empty = httpx.post(url, content=gzip.compress(b""), headers={**auth, "content-encoding": "gzip"})
    assert empty.status_code == 200
    ExportMetricsServiceResponse.FromString(empty.content)
    assert hub.counters.get("otlp_refused_exports") == 2


def test_histogram_quantile_matches_prometheus() -> None:
    # histogram_quantile(0.5, ...) over buckets le=1:2, le=2:6, le=+Inf:8 is 1 + (4 - 2) / 4 = 1.5
    assert histogram_quantile(0.5, [1.0, 2.0], [2, 4, 2]) == 1.5
    assert histogram_quantile(0.99, [1.0, 2.0], [2, 4, 2]) == 2.0  # the overflow bucket: last finite bound
    assert histogram_quantile(0.5, [1.0], [0, 0]) != histogram_quantile(0.5, [1.0], [0, 0])  # NaN


def _export(service: str | None, ts_ns: int, bounds: list[float], counts: list[int]) -> bytes:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    if service is not None:
        attr = resource.resource.attributes.add()
        attr.key, attr.value.string_value = "service.name", service
    metric = resource.scope_metrics.add().metrics.add()
    metric.name = "gen_ai.server.request.duration"
    metric.histogram.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    point = metric.histogram.data_points.add()
    point.start_time_unix_nano, point.time_unix_nano = ts_ns - 10**10, ts_ns
    point.explicit_bounds.extend(bounds)
    point.bucket_counts.extend(counts)
    point.count = sum(counts)
    return request.SerializeToString()


def test_hand_made_exports_at_the_edges(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    url = f"{server.url}/v1/metrics"
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/x-protobuf"}
    now_ns = time.time_ns()
    # from 1970: refused like any batch older than the hub keeps (before: stored as it came)
    old = httpx.post(url, content=_export("chat", 10**10, [0.1], [1, 1]), headers=auth)
    assert old.status_code == 400 and "old" in old.json()["error"]
    # no service.name: acknowledged as a partial success, nothing stored
    anonymous = httpx.post(url, content=_export(None, now_ns, [0.1], [1, 1]), headers=auth)
    answer = ExportMetricsServiceResponse.FromString(anonymous.content)
    assert anonymous.status_code == 200 and answer.partial_success.rejected_data_points == 1
    # infinite bounds and a short counts list: stored without the quantiles it cannot have
    odd = httpx.post(url, content=_export("odd", now_ns, [math.inf, 0.5, 0.1], [3]), headers=auth)
    assert odd.status_code == 200
    (row,) = [r for r in hub.store.snapshot(None, None) if r["labels"].get("service") == "odd"]
    assert all(math.isfinite(v) for v in row["values"].values())
    assert row["values"]["inference_requests_per_second"] == pytest.approx(0.3)
