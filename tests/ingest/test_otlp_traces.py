"""OTLP/HTTP traces from the real OpenTelemetry SDK: server spans become latency and TTFT quantiles."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from gpuscope.hub import Hub
from gpuscope.ingest.payload import Limits
from gpuscope.web.server import HubServer
from hubserve import memory_hub, serve_hub

TOKEN = "an-ingest-token-of-enough-length"


@pytest.fixture
def served() -> Iterator[tuple[HubServer, Hub]]:
    hub = memory_hub()
    with serve_hub(hub, tokens=[TOKEN], limits=Limits(max_past_s=7 * 86400)) as server:
        yield server, hub


def test_server_spans_become_latency_and_ttft(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", headers={"authorization": f"Bearer {TOKEN}"}
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "chat", "host.name": "node-3"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm-like")
    for i in range(20):
        # the attributes vLLM puts on its request spans (seconds)
        attrs = {"gen_ai.latency.e2e": 0.5 + i * 0.01, "gen_ai.latency.time_to_first_token": 0.05}
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes=attrs):
            pass
    with tracer.start_as_current_span("tokenize", kind=SpanKind.INTERNAL):  # not a request: ignored
        time.sleep(0.01)
    assert provider.force_flush(10_000)
    (row,) = [r for r in hub.store.snapshot(None, None) if r["labels"].get("service") == "chat"]
    assert row["labels"] == {"service": "chat", "node": "node-3"}
    values = row["values"]
    assert 0.5 <= values["inference_latency_p50_seconds"] <= 0.7
    assert values["inference_latency_p99_seconds"] == pytest.approx(0.69, abs=0.005)
    assert values["inference_ttft_p95_seconds"] == pytest.approx(0.05)
    assert "inference_requests_per_second" not in values  # sampled traces give no rates
    provider.shutdown()


def _export(service: str | None, end_ns: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    if service is not None:
        attr = resource.resource.attributes.add()
        attr.key, attr.value.string_value = "service.name", service
    span = resource.scope_spans.add().spans.add()
    span.kind = Span.SpanKind.SPAN_KIND_SERVER
    span.start_time_unix_nano, span.end_time_unix_nano = end_ns - 200_000_000, end_ns
    return request.SerializeToString()


def test_hand_made_trace_exports_at_the_edges(served: tuple[HubServer, Hub]) -> None:
    server, hub = served
    url = f"{server.url}/v1/traces"
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/x-protobuf"}
    anonymous = httpx.post(url, content=_export(None, time.time_ns()), headers=auth)
    assert anonymous.status_code == 200
    assert ExportTraceServiceResponse.FromString(anonymous.content).partial_success.rejected_spans == 1
    old = httpx.post(url, content=_export("chat", 10**9), headers=auth)
    assert old.status_code == 400 and "old" in old.json()["error"]
    plain = httpx.post(url, content=_export("svc", time.time_ns()), headers=auth)
    assert plain.status_code == 200
    (row,) = [r for r in hub.store.snapshot(None, None) if r["labels"].get("service") == "svc"]
    assert row["values"]["inference_latency_p50_seconds"] == pytest.approx(0.2)  # the span's duration
    assert httpx.post(url, content=b"\xff\xff", headers=auth).status_code == 400
    assert httpx.post(url, content=_export("svc", time.time_ns())).status_code == 401
