"""OTLP/HTTP traces (``POST /v1/traces``): request latency and time to first token from server spans.

Each export becomes one frame per service (``service.name``; ``host.name`` as ``node``) with the
p50/p95/p99 of its server spans' latency and, where spans carry it, of their time to first token.
Latency is the span's ``gen_ai.latency.e2e`` attribute when present, else its duration. Traces are
usually sampled, so no request or error rates are derived from them (export metrics for those).

Span attribute names as vLLM sets them on its request spans: vllm-project/vllm vllm/tracing.py
@91310096deedb007defd3f019a7058ac4e8587d9 (``SpanAttributes.GEN_AI_LATENCY_E2E``,
``GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN``, in seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gpuscope.ingest.otlp import QUANTILES, attributes, decode_export
from gpuscope.model import Batch, Frame

PATH = "/v1/traces"
E2E = "gen_ai.latency.e2e"
TTFT = "gen_ai.latency.time_to_first_token"
SERVER = Span.SpanKind.SPAN_KIND_SERVER


def decode(body: bytes, content_type: str, encoding: str, limit: int) -> ExportTraceServiceRequest:
    return decode_export(body, content_type, encoding, limit, ExportTraceServiceRequest(), "traces")


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _quantiles(prefix: str, samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    values = np.quantile(np.asarray(samples), [q for q, _ in QUANTILES])
    return {f"{prefix}_{suffix}_seconds": float(v) for (_, suffix), v in zip(QUANTILES, values, strict=True)}


def to_batch(request: ExportTraceServiceRequest) -> tuple[Batch, int]:
    """The frames of an export, and how many server spans could not be used (no ``service.name``)."""
    latency: dict[tuple[str, str], list[float]] = {}
    ttft: dict[tuple[str, str], list[float]] = {}
    ends: dict[tuple[str, str], float] = {}
    rejected = 0
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        key = (resource.get("service.name", ""), resource.get("host.name", ""))
        spans: Iterable[Span] = (s for scope in resource_spans.scope_spans for s in scope.spans)
        for span in spans:
            attrs = attributes(span.attributes)
            if span.kind != SERVER and E2E not in attrs:
                continue
            if not key[0]:
                rejected += 1
                continue
            duration = max(span.end_time_unix_nano - span.start_time_unix_nano, 0) / 1e9
            e2e = _seconds(attrs.get(E2E))
            latency.setdefault(key, []).append(duration if e2e is None else e2e)
            first = _seconds(attrs.get(TTFT))
            if first is not None:
                ttft.setdefault(key, []).append(first)
            ends[key] = max(ends.get(key, 0.0), span.end_time_unix_nano / 1e9)
    frames = []
    for (service, node), samples in sorted(latency.items()):
        values = _quantiles("inference_latency", samples) | _quantiles(
            "inference_ttft", ttft.get((service, node), [])
        )
        labels = {"service": service, **({"node": node} if node else {})}
        names = sorted(values)
        row = np.array([[values[n] for n in names]], dtype=np.float64)
        frames.append(Frame(ends[(service, node)], names, [labels], row))
    return Batch(source="otlp-traces", frames=frames), rejected


def response(rejected: int) -> bytes:
    answer = ExportTraceServiceResponse()
    if rejected:
        answer.partial_success.rejected_spans = rejected
        answer.partial_success.error_message = "server spans without a service.name resource attribute"
    return answer.SerializeToString()
