"""Serving engines as a source: the ``serving`` collector (``gpuscope agent --scrape URL``).

Scrapes vLLM, SGLang, TGI or Triton ``/metrics`` (the engine is recognised by its metric
prefix) and reports one row per model and version in the serving schema
(:mod:`~gpuscope.collect.serving_engines`): queue depth, running requests, KV-cache use,
preemptions, batch size, request and failure counters and their rates, and p50/p95/p99 of
end-to-end latency, time to first token and inter-token latency over the observations since the
previous scrape (the whole histogram on the first one). A round with no new observations has no
percentiles rather than stale ones. A model served by several engines (vLLM's data-parallel
``engine``s, SGLang's ``dp_rank``/``pp_rank``) also gets a row per engine, labelled ``dp_rank`` (and
``pp_rank``), with its queue, running requests and KV-cache use (``inference_engine_*``, a frame of
their own, so the model's sums are never counted twice).

Labels the engine does not know come from the URL's fragment, which is never sent to the
server: ``http://h:8000/metrics#service=chat&model=llama-8b&version=v7``. ``kv_block_bytes=N``
there turns vLLM's block count into KV-cache bytes (the GPU memory split of DESIGN issue 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Self
from urllib.parse import parse_qsl, urlsplit

import httpx

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.httptext import HttpText
from gpuscope.collect.nvml import frame
from gpuscope.collect.promtext import ExpositionError, Sample, parse_exposition
from gpuscope.collect.serving_engines import (
    BATCH,
    KV,
    KV_BLOCKS,
    PER_ENGINE,
    QUANTILES,
    RATES,
    RUNNING,
    EngineSpec,
    detect_engine,
)
from gpuscope.collect.serving_map import EngineRow, RowKey, bucket_quantile, histogram_delta, read_rows
from gpuscope.model import Labels

Rows = list[tuple[Labels, dict[str, float]]]

#: every column this collector can report, in the order frames list them
SERVING_COLUMNS: tuple[str, ...] = (
    "inference_requests_per_second",
    "inference_errors_per_second",
    *(f"inference_{d}_{p}_seconds" for d in ("latency", "ttft", "itl") for p, _ in QUANTILES),
    "inference_queue_depth",
    "inference_running_requests",
    "inference_batch_size",
    "inference_kv_cache_usage_ratio",
    "inference_preemptions_total",
    "inference_requests_total",
    "inference_errors_total",
    "inference_kv_cache_capacity_blocks",
    "inference_memory_kv_cache_bytes",
    *(f"inference_queue_time_{p}_seconds" for p, _ in QUANTILES),
    "inference_latency_mean_seconds",
    "inference_queue_time_mean_seconds",
    "inference_prompt_tokens_total",
    "inference_generation_tokens_total",
    "inference_rejections_total",
    "inference_http_5xx_total",
    "inference_prompt_tokens_per_second",
    "inference_generation_tokens_per_second",
    "inference_rejections_per_second",
    "inference_http_5xx_per_second",
)
_FRAGMENT_LABELS = ("service", "model", "version", "cluster")


def split_target(url: str) -> tuple[str, dict[str, str]]:
    """The URL to fetch and the options of its fragment; a malformed target is a ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--scrape needs an http(s) URL, got {url!r}")
    options = dict(parse_qsl(parts.fragment, keep_blank_values=False, strict_parsing=bool(parts.fragment)))
    unknown = sorted(set(options) - {*_FRAGMENT_LABELS, "kv_block_bytes"})
    if unknown:
        raise ValueError(f"{url}: unknown fragment option(s) {', '.join(unknown)}")
    block = options.get("kv_block_bytes", "0")
    if not (block.isascii() and block.isdigit() and len(block) <= 15):
        raise ValueError(f"{url}: kv_block_bytes must be a whole number of bytes")
    return parts._replace(fragment="").geturl(), options


@dataclass(slots=True)
class _Previous:
    ts: float
    counters: dict[str, float]
    histograms: dict[str, dict[float, float]]
    raw: dict[str, float]


@dataclass(slots=True)
class EngineScraper:
    """One ``/metrics`` target: its labels, and what the previous scrape saw (for rates, deltas)."""

    url: str
    node: str
    options: Mapping[str, str] = field(default_factory=dict)
    previous: dict[RowKey, _Previous] = field(default_factory=dict)
    engine: str = ""
    resets: int = 0

    def rows(self, text: str, now: float) -> Rows:
        """Parse one scrape into schema rows; raises ExpositionError or ValueError (no engine)."""
        return self.scrape(text, now)[0]

    def scrape(self, text: str, now: float) -> tuple[Rows, Rows]:
        """One scrape's rows per model and rows per engine (where a model has several)."""
        samples = parse_exposition(text)
        spec = detect_engine({s.name for s in samples})
        if spec is None:
            raise ValueError("no vLLM, SGLang, TGI or Triton metrics in the exposition")
        self.engine = spec.name
        kv_blocks = _vllm_blocks(samples) if spec.name == "vllm" else None
        out: Rows = []
        engines: Rows = []
        for key, row in sorted(read_rows(samples, spec).items()):
            for engine, gauges in sorted(row.engines.items()):
                engines.append(({**self._labels(key, spec), **dict(engine)}, gauges))
            values = self._values(key, row, spec, now)
            if kv_blocks is not None:
                values[KV_BLOCKS] = kv_blocks
                block_bytes = self.options.get("kv_block_bytes")
                if block_bytes and KV in values:
                    values["inference_memory_kv_cache_bytes"] = kv_blocks * int(block_bytes) * values[KV]
            if values:
                out.append((self._labels(key, spec), values))
        return out, engines

    def _labels(self, key: RowKey, spec: EngineSpec) -> Labels:
        model, version = key
        labels: Labels = {"node": self.node, "engine": spec.name}
        model = self.options.get("model") or model
        version = self.options.get("version") or version
        if model:
            labels["model"] = model
        if version:
            labels["version"] = version
        labels["service"] = self.options.get("service") or model or (urlsplit(self.url).netloc)
        if self.options.get("cluster"):
            labels["cluster"] = self.options["cluster"]
        return labels

    def _values(self, key: RowKey, row: EngineRow, spec: EngineSpec, now: float) -> dict[str, float]:
        values = dict(row.gauges)
        values.update(row.counters)
        if spec.batch_is_running and RUNNING in values:
            values.setdefault(BATCH, values[RUNNING])
        prev = self.previous.get(key)
        dt = now - prev.ts if prev is not None else 0.0
        if prev is not None and dt > 0:
            for canon, column in RATES.items():
                if canon in row.counters:
                    values[column] = self._rate(row.counters[canon], prev.counters.get(canon), dt)
            for dist, (total, factor, count) in spec.mean_counters.items():
                spent = self._rate(row.raw.get(total, math.nan), prev.raw.get(total), dt)
                done = self._rate(row.raw.get(count, math.nan), prev.raw.get(count), dt)
                if done > 0 and spent >= 0:
                    values[f"inference_{dist}_mean_seconds"] = spent / done * factor
            if spec.batch_ratio is not None:
                num, den = (
                    self._rate(row.raw.get(n, math.nan), prev.raw.get(n), dt) for n in spec.batch_ratio
                )
                if den > 0:
                    values[BATCH] = num / den
        for dist, hist in row.histograms.items():
            before = prev.histograms.get(dist) if prev is not None else None
            window = histogram_delta(hist, before)
            for label, q in QUANTILES:
                v = bucket_quantile(window, q)
                if math.isfinite(v):
                    values[f"inference_{dist}_{label}_seconds"] = v
        for dist, quantiles in row.summaries.items():
            if dist in row.histograms:
                continue
            for label, q in QUANTILES:
                if q in quantiles:
                    values[f"inference_{dist}_{label}_seconds"] = quantiles[q]
        self.previous[key] = _Previous(now, dict(row.counters), row.histograms, dict(row.raw))
        return {k: v for k, v in values.items() if math.isfinite(v)}

    def _rate(self, now_value: float, before: float | None, dt: float) -> float:
        if before is None or not math.isfinite(now_value):
            return math.nan
        if now_value < before:  # the engine restarted: its counter began again from zero
            self.resets += 1
            return now_value / dt
        return (now_value - before) / dt


def _vllm_blocks(samples: list[Sample]) -> float | None:
    """vLLM's KV-cache capacity in blocks, from its ``cache_config_info`` labels."""
    for s in samples:
        if s.name == "vllm:cache_config_info":
            blocks = s.labels.get("num_gpu_blocks", "")
            if blocks.isascii() and blocks.isdigit() and len(blocks) <= 15:
                return float(blocks)
    return None


@register_collector
class ServingCollector(Collector):
    """Inference-engine telemetry from one or more ``/metrics`` URLs."""

    name = "serving"
    enabled_by = ("scrape_urls",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        urls: list[str] | None = None,
        timeout: float = 2.0,
        fetch: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        if not urls:
            raise ValueError("the serving collector needs at least one --scrape URL")
        self.targets = []
        for url in urls:
            target, options = split_target(url)
            self.targets.append(EngineScraper(target, node, options))
        self._http = HttpText(timeout)
        self._fetch = fetch or self._http.get

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        urls = ctx.options.get("scrape_urls") or []
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root, urls=list(urls))

    def collect(self, now: float) -> Collected:
        out = Collected()
        rows: Rows = []
        engines: Rows = []
        failed = 0
        for target in self.targets:
            try:
                models, parts = target.scrape(self._fetch(target.url), now)
                rows.extend(models)
                engines.extend(parts)
            except ExpositionError as exc:
                failed += 1
                out.errors.append(CollectorError("serving_format", f"{target.url}: {exc}"))
            except (httpx.HTTPError, ValueError) as exc:
                failed += 1
                out.errors.append(CollectorError("serving_scrape", f"{target.url}: {exc}"))
        if failed == len(self.targets):
            raise RuntimeError("; ".join(e.message for e in out.errors))
        for order, part in ((SERVING_COLUMNS, rows), (tuple(PER_ENGINE.values()), engines)):
            f = frame(now, order, part)
            if f is not None:
                out.frames.append(f)
        return out

    def close(self) -> None:
        self._http.close()
