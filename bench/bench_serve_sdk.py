"""Inference SDK cost: one request record (``with svc.request() as r: r.tokens(1)``) and one
``svc.predict`` beside an OpenTelemetry histogram ``record`` and a prometheus_client ``observe``
(when installed), all in this run; then a replay of the Azure LLM inference trace (when present
under ../shared/data) through the SDK to a real hub, reporting drops and delivery.

Budget (issue 5): ≤ 3 µs per request record on the serving thread, never blocking on I/O.

usage: python bench/bench_serve_sdk.py [--calls 200000] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import SHARED_DATA, free_port, per_call_us, print_table

BUDGET_US = 3.0
TRACE = SHARED_DATA / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_conv.csv"


@contextlib.contextmanager
def local_hub(tmp: Path) -> Iterator[str]:
    """A real hub served from a thread of this process, so the SDK's thread competes for the GIL."""
    from gpuscope.hub import Hub
    from gpuscope.store.duckdb import DuckDBStore
    from gpuscope.web.server import HubServer

    server = HubServer(Hub(DuckDBStore(str(tmp / "hub.duckdb"))), "127.0.0.1", free_port())
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def bench_gpuscope(hub: str, tmp: Path, calls: int) -> tuple[float, float, dict[str, int]]:
    import gpuscope

    svc = gpuscope.serve("bench", "m", "v1", hub, state_dir=tmp / "serve", capacity=20 * calls)

    def requests(n: int) -> None:
        request = svc.request
        for _ in range(n):
            with request() as r:
                r.tokens(1)

    def predicts(n: int) -> None:
        predict = svc.predict
        for i in range(n):
            predict(1, confidence=0.9, features={"x": i})

    req_us = per_call_us(requests, calls)
    pred_us = per_call_us(predicts, calls // 4)
    svc.close(timeout=60)
    return req_us, pred_us, svc.stats()


def bench_otel(calls: int) -> float | None:
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        return None
    from opentelemetry.sdk.metrics import MeterProvider

    hist = MeterProvider().get_meter("bench").create_histogram("latency", unit="s")
    attrs = {"service": "bench", "version": "v1"}

    def loop(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            hist.record(time.perf_counter() - t0, attrs)

    return per_call_us(loop, calls)


def bench_prometheus(calls: int) -> float | None:
    if importlib.util.find_spec("prometheus_client") is None:
        return None
    from prometheus_client import CollectorRegistry, Histogram

    hist = Histogram("latency_seconds", "x", ["version"], registry=CollectorRegistry()).labels("v1")

    def loop(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            hist.observe(time.perf_counter() - t0)

    return per_call_us(loop, calls)


def replay_trace(hub: str, tmp: Path) -> dict[str, Any] | None:
    """Every request of the trace through the SDK (time compressed), with token counts as features."""
    if not TRACE.exists():
        return None
    import gpuscope

    with TRACE.open() as fh:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(fh)]
    svc = gpuscope.serve("trace", "m", "v1", hub, state_dir=tmp / "trace", capacity=len(rows) * 2)
    t0 = time.perf_counter()
    for ctx, gen in rows:
        with svc.request() as r:
            r.first_token()
            r.tokens(gen)
        svc.predict(gen > 200, confidence=0.8, features={"context_tokens": ctx, "generated_tokens": gen})
    per_request = (time.perf_counter() - t0) / len(rows) * 1e6
    svc.close(timeout=60)
    return {"requests": len(rows), "us_per_request_with_predict": per_request, **svc.stats()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, local_hub(Path(d)) as hub:
        req_us, pred_us, stats = bench_gpuscope(hub, Path(d), args.calls)
        result["gpuscope_request_us"], result["gpuscope_predict_us"] = req_us, pred_us
        result["gpuscope_stats"] = stats
        result["otel_record_us"] = bench_otel(args.calls)
        result["prometheus_observe_us"] = bench_prometheus(args.calls)
        result["trace_replay"] = replay_trace(hub, Path(d))

    def fmt(v: float | None) -> str:
        return "skipped (not installed)" if v is None else f"{v:.2f} µs"

    rows = [
        ["gpuscope request record (with + tokens)", fmt(req_us), f"≤ {BUDGET_US} µs"],
        ["gpuscope predict (1 feature)", fmt(pred_us), ""],
        ["OpenTelemetry histogram.record (anchor)", fmt(result["otel_record_us"]), ""],
        ["prometheus_client observe (anchor)", fmt(result["prometheus_observe_us"]), ""],
        [
            "dropped requests / batches refused",
            f"{stats['dropped_requests']} / {stats.get('batches_refused', 0)}",
            "0",
        ],
    ]
    trace = result["trace_replay"]
    if trace is None:
        rows.append(["Azure LLM trace replay", "skipped (../shared/data absent)", ""])
    else:
        rows.append(
            [
                f"Azure trace replay, {trace['requests']} requests",
                f"{trace['us_per_request_with_predict']:.2f} µs/request incl. predict",
                f"drops {trace['dropped_requests']}",
            ]
        )
    print_table("Inference SDK: cost on the serving thread", ["what", "measured", "budget"], rows)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if req_us <= BUDGET_US and not stats["dropped_requests"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
