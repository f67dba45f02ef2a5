"""What each serving engine calls the signals of one schema (vLLM, SGLang, TGI, Triton).

Every engine names queue depth, running requests, KV-cache use, latencies and outcomes its own
way, and renames them between releases. This table maps them onto gpuscope's names; where an
engine has an old and a new name, the new one is listed first and wins when both are exposed
(vLLM exposes both for a while: ``gpu_cache_usage_perc`` → ``kv_cache_usage_perc``,
``time_per_output_token_seconds`` → ``inter_token_latency_seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: canonical gauge / counter / distribution names of the serving schema
QUEUE = "inference_queue_depth"
RUNNING = "inference_running_requests"
KV = "inference_kv_cache_usage_ratio"
BATCH = "inference_batch_size"
PREEMPT = "inference_preemptions_total"
REQUESTS = "inference_requests_total"
ERRORS = "inference_errors_total"
KV_BLOCKS = "inference_kv_cache_capacity_blocks"
#: distributions become ``inference_<dist>_p50/p95/p99_seconds``
LATENCY, TTFT, ITL = "latency", "ttft", "itl"
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine's names. Candidates are ``(source name, factor to gpuscope units)``, best first."""

    name: str
    prefix: str
    model_label: str | None = None
    version_label: str | None = None
    gauges: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    #: counters summed over their other labels (``finished_reason``, ``err``)
    counters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: label values that turn a counter sample into a failure (vLLM's aborted requests)
    failure_labels: dict[str, frozenset[str]] = field(default_factory=dict)
    histograms: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    #: Prometheus summaries (``quantile`` label), used when no histogram of that distribution exists
    summaries: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    #: continuous batching: the running requests are the batch
    batch_is_running: bool = False
    #: counters whose rate ratio is the mean batch size (Triton: inferences per execution)
    batch_ratio: tuple[str, str] | None = None


VLLM = EngineSpec(
    name="vllm",
    prefix="vllm:",
    model_label="model_name",
    gauges={
        QUEUE: (("vllm:num_requests_waiting", 1.0),),
        RUNNING: (("vllm:num_requests_running", 1.0),),
        KV: (("vllm:kv_cache_usage_perc", 1.0), ("vllm:gpu_cache_usage_perc", 1.0)),
    },
    counters={
        PREEMPT: ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        REQUESTS: ("vllm:request_success_total",),
    },
    failure_labels={"finished_reason": frozenset({"abort", "error"})},
    histograms={
        LATENCY: (("vllm:e2e_request_latency_seconds", 1.0),),
        TTFT: (("vllm:time_to_first_token_seconds", 1.0),),
        ITL: (("vllm:inter_token_latency_seconds", 1.0), ("vllm:time_per_output_token_seconds", 1.0)),
    },
    batch_is_running=True,
)

SGLANG = EngineSpec(
    name="sglang",
    prefix="sglang:",
    model_label="model_name",
    gauges={
        QUEUE: (("sglang:num_queue_reqs", 1.0),),
        RUNNING: (("sglang:num_running_reqs", 1.0),),
        KV: (("sglang:token_usage", 1.0),),
    },
    counters={
        REQUESTS: ("sglang:num_requests_total",),
        ERRORS: ("sglang:num_aborted_requests_total",),
    },
    histograms={
        LATENCY: (("sglang:e2e_request_latency_seconds", 1.0),),
        TTFT: (("sglang:time_to_first_token_seconds", 1.0),),
        ITL: (("sglang:inter_token_latency_seconds", 1.0), ("sglang:time_per_output_token_seconds", 1.0)),
    },
    batch_is_running=True,
)

TGI = EngineSpec(
    name="tgi",
    prefix="tgi_",
    gauges={
        QUEUE: (("tgi_queue_size", 1.0),),
        RUNNING: (("tgi_batch_current_size", 1.0),),
        BATCH: (("tgi_batch_current_size", 1.0),),
    },
    counters={REQUESTS: ("tgi_request_success",), ERRORS: ("tgi_request_failure",)},
    histograms={
        LATENCY: (("tgi_request_duration", 1.0),),
        ITL: (("tgi_request_mean_time_per_token_duration", 1.0),),
    },
)

TRITON = EngineSpec(
    name="triton",
    prefix="nv_inference_",
    model_label="model",
    version_label="version",
    gauges={QUEUE: (("nv_inference_pending_request_count", 1.0),)},
    counters={REQUESTS: ("nv_inference_request_success",), ERRORS: ("nv_inference_request_failure",)},
    histograms={TTFT: (("nv_inference_first_response_histogram_ms", 1e-3),)},
    summaries={LATENCY: (("nv_inference_request_summary_us", 1e-6),)},
    batch_ratio=("nv_inference_count", "nv_inference_exec_count"),
)

ENGINES: tuple[EngineSpec, ...] = (VLLM, SGLANG, TGI, TRITON)


def detect_engine(names: set[str]) -> EngineSpec | None:
    """The engine whose metric prefix the exposition uses most (None when no engine is recognised)."""
    best, hits = None, 0
    for spec in ENGINES:
        n = sum(1 for name in names if name.startswith(spec.prefix))
        if n > hits:
            best, hits = spec, n
    return best
