"""What each serving engine calls the signals of one schema (vLLM, SGLang, TGI, Triton).

Names from: vllm-project/vllm vllm/v1/metrics/loggers.py at a6f0308cfe806b7731ad4979c9bea6e470c35efd;
sgl-project/sglang python/sglang/srt/metrics/collector.py at 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538;
huggingface/text-generation-inference docs/source/reference/metrics.md and router/src/infer/mod.rs at
db931fc; triton-inference-server/server docs/user_guide/metrics.md at
067c1e968356606483c52ecd36e250e76cc9406a.

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
PROMPT_TOKENS = "inference_prompt_tokens_total"
GENERATION_TOKENS = "inference_generation_tokens_total"
REJECTIONS = "inference_rejections_total"
HTTP_5XX = "inference_http_5xx_total"
#: counters whose per-second rate is reported too: canonical counter -> rate column
RATES: dict[str, str] = {
    REQUESTS: "inference_requests_per_second",
    ERRORS: "inference_errors_per_second",
    PROMPT_TOKENS: "inference_prompt_tokens_per_second",
    GENERATION_TOKENS: "inference_generation_tokens_per_second",
    REJECTIONS: "inference_rejections_per_second",
    HTTP_5XX: "inference_http_5xx_per_second",
}
#: gauges that are ratios: several engines or ranks give the worst (max), counts are summed
MAX_GAUGES = frozenset({KV})
#: gauges kept per engine as well (``inference_engine_*``, DETAIL_METRICS): the model's row sums or
#: maxes them, so one engine saturated among idle ones is visible only in its own series
PER_ENGINE: dict[str, str] = {
    QUEUE: "inference_engine_queue_depth",
    RUNNING: "inference_engine_running_requests",
    KV: "inference_engine_kv_cache_usage_ratio",
}
#: labels of a rank that shares its replica's scheduler state (SGLang's tensor- and expert-parallel
#: ranks repeat one scheduler's numbers): max within a replica, then sum over replicas
SHARD_LABELS = frozenset({"tp_rank", "moe_ep_rank", "attn_tp_rank"})
#: distributions become ``inference_<dist>_p50/p95/p99_seconds``
LATENCY, TTFT, ITL, QUEUE_TIME = "latency", "ttft", "itl", "queue_time"
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
    #: counters of the samples whose label starts with one of the prefixes: canonical counter ->
    #: ((source name, label, prefixes), ...); page-wide ones (HTTP status) join the page's one model
    labelled_counters: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = field(default_factory=dict)
    #: cumulative time counters and the count they divide by: distribution -> (name, factor, count name)
    mean_counters: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    #: the engine's labels naming one engine (scheduler) of a model -> ours, on per-engine rows
    engine_labels: dict[str, str] = field(default_factory=dict)
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
        PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
        GENERATION_TOKENS: ("vllm:generation_tokens_total",),
        # vllm-project/vllm PR #55812 (HTTP 503 from queue limits), not yet in loggers.py
        REJECTIONS: ("vllm:admission_rejections_total",),
    },
    failure_labels={"finished_reason": frozenset({"abort", "error"})},
    # prometheus-fastapi-instrumentator on vLLM's API server groups status codes as "5xx"
    labelled_counters={HTTP_5XX: (("http_requests_total", "status", ("5",)),)},
    histograms={
        LATENCY: (("vllm:e2e_request_latency_seconds", 1.0),),
        TTFT: (("vllm:time_to_first_token_seconds", 1.0),),
        ITL: (("vllm:inter_token_latency_seconds", 1.0), ("vllm:time_per_output_token_seconds", 1.0)),
        QUEUE_TIME: (("vllm:request_queue_time_seconds", 1.0),),
    },
    # loggers.py: labelnames ["model_name", "engine"], one value per engine index (data-parallel rank)
    engine_labels={"engine": "dp_rank"},
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
        PROMPT_TOKENS: ("sglang:prompt_tokens_total",),
        GENERATION_TOKENS: ("sglang:generation_tokens_total",),
        # SGLang's counterpart of preemption (python/sglang/srt/metrics/collector.py at 00ae9c1)
        PREEMPT: ("sglang:num_retracted_requests_total",),
    },
    histograms={
        LATENCY: (("sglang:e2e_request_latency_seconds", 1.0),),
        TTFT: (("sglang:time_to_first_token_seconds", 1.0),),
        ITL: (("sglang:inter_token_latency_seconds", 1.0), ("sglang:time_per_output_token_seconds", 1.0)),
        QUEUE_TIME: (("sglang:queue_time_seconds", 1.0),),
    },
    # collector.py: each data-parallel (and pipeline) rank runs a scheduler of its own
    engine_labels={"dp_rank": "dp_rank", "pp_rank": "pp_rank"},
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
    counters={
        REQUESTS: ("tgi_request_success",),
        ERRORS: ("tgi_request_failure",),
        # the sums of TGI's per-request token histograms
        PROMPT_TOKENS: ("tgi_request_input_length_sum",),
        GENERATION_TOKENS: ("tgi_request_generated_tokens_sum",),
    },
    # router/src/infer/mod.rs: err="overloaded" is the queue refusing a request (HTTP 429)
    labelled_counters={REJECTIONS: (("tgi_request_failure", "err", ("overloaded",)),)},
    histograms={
        LATENCY: (("tgi_request_duration", 1.0),),
        ITL: (("tgi_request_mean_time_per_token_duration", 1.0),),
        QUEUE_TIME: (("tgi_request_queue_duration", 1.0),),
    },
)

TRITON = EngineSpec(
    name="triton",
    prefix="nv_inference_",
    model_label="model",
    version_label="version",
    gauges={QUEUE: (("nv_inference_pending_request_count", 1.0),)},
    counters={REQUESTS: ("nv_inference_request_success",), ERRORS: ("nv_inference_request_failure",)},
    labelled_counters={REJECTIONS: (("nv_inference_request_failure", "reason", ("REJECTED",)),)},
    histograms={TTFT: (("nv_inference_first_response_histogram_ms", 1e-3),)},
    summaries={
        LATENCY: (("nv_inference_request_summary_us", 1e-6),),
        QUEUE_TIME: (("nv_inference_queue_summary_us", 1e-6),),
    },
    # on by default (docs/user_guide/metrics.md "Counters"): cumulative microseconds, whose
    # _count twin is nv_inference_request_success
    mean_counters={
        LATENCY: ("nv_inference_request_duration_us", 1e-6, "nv_inference_request_success"),
        QUEUE_TIME: ("nv_inference_queue_duration_us", 1e-6, "nv_inference_request_success"),
    },
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
