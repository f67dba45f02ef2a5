"""OTLP/HTTP metrics (``POST /v1/metrics``) mapped onto gpuscope's inference signals.

A service instrumented with OpenTelemetry exports its request-duration histograms; each export
becomes one frame per service (``service.name``, and ``host.name`` as ``node`` when present) with
the request and error rates and the p50/p95/p99 of latency, time to first token and time per output
token over the export interval. Cumulative histograms (the SDK's default) are turned into deltas
against the previous export of the same stream; a stream seen for the first time counts from its
start time. Metrics with no mapping are acknowledged and counted (``otlp_points_unmapped``), never
stored under a made-up name.

Metric and attribute names from the OpenTelemetry semantic conventions:
open-telemetry/semantic-conventions model/gen-ai/gen-ai-server-metrics.yaml
@621d35f717e5bbaf3b8a5b91f1a918913dcced31 (gen_ai.server.request.duration,
gen_ai.server.time_to_first_token, gen_ai.server.time_per_output_token, error.type) and
model/http/metrics.yaml @c2089b1b0a8ba0e49554fa41aa98c133fdf1d11f (http.server.request.duration,
with http.response.status_code of model/http/registry.yaml).
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, HistogramDataPoint, Metric

from gpuscope.counters import Counters
from gpuscope.model import Batch, Frame

PATH = "/v1/metrics"
REQUEST_DURATION = ("gen_ai.server.request.duration", "http.server.request.duration")  # preferred first
HISTOGRAMS = {
    "gen_ai.server.request.duration": "inference_latency",
    "http.server.request.duration": "inference_latency",
    "gen_ai.server.time_to_first_token": "inference_ttft",
    "gen_ai.server.time_per_output_token": "inference_itl",
}
QUANTILES = ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"))
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
MIN_INTERVAL_S = 0.001  # a rate over a shorter interval is noise, not a rate


M = TypeVar("M", bound=Message)


class OtlpError(ValueError):
    """An export the hub cannot read; the message says what was wrong."""


def histogram_quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    """Prometheus' ``histogram_quantile`` over explicit buckets: linear within the bucket, the
    lowest bucket from 0, and the last finite bound for the overflow bucket."""
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    seen = 0.0
    for i, count in enumerate(counts):
        if seen + count >= rank and count > 0:
            if i >= len(bounds):
                return bounds[-1] if bounds else math.nan
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
    return bounds[-1] if bounds else math.nan


def decode_export(body: bytes, content_type: str, encoding: str, limit: int, into: M, what: str) -> M:
    """``into`` filled from ``body`` (protobuf or JSON, optionally gzip); OtlpError when unreadable."""
    if encoding.strip().lower() == "gzip":
        try:
            stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = stream.decompress(body, limit + 1)
        except zlib.error as exc:
            raise OtlpError(f"not valid gzip: {exc}") from None
        if len(body) > limit:
            raise OtlpError(f"more than {limit} bytes once decompressed")
    elif encoding.strip() not in ("", "identity"):
        raise OtlpError(f"content-encoding {encoding!r} is not supported (gzip or none)")
    try:
        if content_type.split(";")[0].strip().lower() == "application/json":
            json_format.Parse(body.decode("utf-8"), into, ignore_unknown_fields=True)
        else:
            into.ParseFromString(body)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise OtlpError(f"not an OTLP {what} export: {exc}") from None
    return into


def attributes(items: Iterable[KeyValue]) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in items:
        kind = kv.value.WhichOneof("value")
        if kind in ("string_value", "int_value", "double_value", "bool_value"):
            out[kv.key] = str(getattr(kv.value, kind))
    return out


def _points(metric: Metric) -> int:
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        return len(metric.gauge.data_points)
    if kind == "sum":
        return len(metric.sum.data_points)
    if kind == "histogram":
        return len(metric.histogram.data_points)
    if kind == "exponential_histogram":
        return len(metric.exponential_histogram.data_points)
    return len(metric.summary.data_points) if kind == "summary" else 0


def _is_error(attrs: dict[str, str]) -> bool:
    status = attrs.get("http.response.status_code", "")
    return "error.type" in attrs or (status.isdigit() and int(status) >= 500)


@dataclass(slots=True)
class _Interval:
    """Bucket counts of one signal of one service over an export, merged across attribute sets."""

    bounds: list[float] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)
    requests: float = 0.0
    errors: float = 0.0
    seconds: float = 0.0
    end: float = 0.0

    def add(self, bounds: list[float], counts: list[float], error: bool, seconds: float, end: float) -> bool:
        if not self.bounds:
            self.bounds, self.counts = list(bounds), [0.0] * len(counts)
        elif bounds != self.bounds or len(counts) != len(self.counts):
            return False  # different bucket layouts cannot be merged: the point is counted, not used
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        n = sum(counts)
        self.requests += n
        self.errors += n if error else 0.0
        self.seconds = max(self.seconds, seconds)
        self.end = max(self.end, end)
        return True


Stream = tuple[str, str, str, tuple[tuple[str, str], ...], int]


class OtlpReceiver:
    """Decodes exports and keeps the last cumulative value of every stream, to take deltas."""

    def __init__(self, counters: Counters, max_streams: int = 100_000) -> None:
        self.counters = counters
        self.max_streams = max_streams
        self._last: dict[Stream, tuple[float, list[float]]] = {}
        self._lock = threading.Lock()

    def decode(
        self, body: bytes, content_type: str, encoding: str, limit: int
    ) -> ExportMetricsServiceRequest:
        """The metrics export in ``body``; OtlpError when unreadable."""
        return decode_export(body, content_type, encoding, limit, ExportMetricsServiceRequest(), "metrics")

    def _delta(
        self, stream: Stream, point: HistogramDataPoint, temporality: int
    ) -> tuple[list[float], float]:
        """(bucket counts over the interval, its length in seconds) of one data point."""
        counts = [float(c) for c in point.bucket_counts]
        end = point.time_unix_nano / 1e9
        start = point.start_time_unix_nano / 1e9
        if temporality != CUMULATIVE:
            return counts, max(end - start, 0.0)
        with self._lock:
            previous = self._last.get(stream)
            if previous is None and len(self._last) >= self.max_streams:
                self.counters.inc("otlp_streams_over_limit")
                return [], 0.0
            self._last[stream] = (end, counts)
        if (
            previous is None
            or len(previous[1]) != len(counts)
            or any(a < b for a, b in zip(counts, previous[1], strict=True))
        ):  # a new stream, or one that restarted: everything since its start
            return counts, max(end - start, 0.0)
        return [a - b for a, b in zip(counts, previous[1], strict=True)], max(end - previous[0], 0.0)

    def to_batch(self, request: ExportMetricsServiceRequest) -> tuple[Batch, int]:
        """The frames of an export, and how many data points of mapped metrics could not be used
        (no ``service.name``, or a bucket layout that differs within one export)."""
        intervals: dict[tuple[str, str, str], _Interval] = {}
        unmapped = rejected = 0
        for resource_metrics in request.resource_metrics:
            resource = attributes(resource_metrics.resource.attributes)
            service, node = resource.get("service.name", ""), resource.get("host.name", "")
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    points = metric.histogram.data_points if metric.WhichOneof("data") == "histogram" else []
                    signal = HISTOGRAMS.get(metric.name)
                    if signal is None or not points:
                        unmapped += _points(metric)
                        continue
                    if not service:
                        rejected += len(points)
                        continue
                    temporality = metric.histogram.aggregation_temporality
                    for point in points:
                        attrs = attributes(point.attributes)
                        stream = (
                            service,
                            node,
                            metric.name,
                            tuple(sorted(attrs.items())),
                            point.start_time_unix_nano,
                        )
                        counts, seconds = self._delta(stream, point, temporality)
                        slot = intervals.setdefault((service, node, metric.name), _Interval())
                        if not counts or not slot.add(
                            list(point.explicit_bounds),
                            counts,
                            _is_error(attrs),
                            seconds,
                            point.time_unix_nano / 1e9,
                        ):
                            rejected += 1
        services = sorted({(s, n) for s, n, _ in intervals})
        frames = [f for f in (self._frame(s, n, intervals) for s, n in services) if f is not None]
        self.counters.inc("otlp_points_unmapped", unmapped)  # other metrics of the service: not ours
        self.counters.inc("otlp_points_rejected", rejected)
        return Batch(source="otlp", frames=frames), rejected

    @staticmethod
    def _frame(service: str, node: str, intervals: dict[tuple[str, str, str], _Interval]) -> Frame | None:
        values: dict[str, float] = {}
        end = 0.0
        requests = next(
            (intervals.get((service, node, m)) for m in REQUEST_DURATION if (service, node, m) in intervals),
            None,
        )
        for (s, n, metric), slot in intervals.items():
            if (s, n) != (service, node) or slot.requests <= 0:
                continue
            if metric in REQUEST_DURATION and slot is not requests:
                continue  # the HTTP histogram only when the service exports no GenAI one
            end = max(end, slot.end)
            for q, suffix in QUANTILES:
                value = histogram_quantile(q, slot.bounds, slot.counts)
                if math.isfinite(value):  # unsorted or infinite bounds give nothing worth storing
                    values[f"{HISTOGRAMS[metric]}_{suffix}_seconds"] = value
        if requests is not None and requests.seconds >= MIN_INTERVAL_S:
            values["inference_requests_per_second"] = requests.requests / requests.seconds
            values["inference_errors_per_second"] = requests.errors / requests.seconds
            end = max(end, requests.end)
        if not values:
            return None
        labels = {"service": service, **({"node": node} if node else {})}
        names = sorted(values)
        return Frame(end, names, [labels], np.array([[values[n] for n in names]], dtype=np.float64))


def response(rejected: int) -> bytes:
    """The ExportMetricsServiceResponse; points not used are reported as a partial success."""
    answer = ExportMetricsServiceResponse()
    if rejected:
        answer.partial_success.rejected_data_points = rejected
        answer.partial_success.error_message = (
            "points without a service.name resource attribute, or with another bucket layout than "
            "the same metric's other points in this export, were not stored"
        )
    return answer.SerializeToString()
