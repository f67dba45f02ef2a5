"""Serving pages shaped like the engines' own: several engines or ranks, Triton's default latency
counters, tokens, queue time, admission rejections and HTTP 5xx.

Names and labels from: vllm-project/vllm vllm/v1/metrics/loggers.py at a6f0308 (labels model_name,
engine; prometheus_client adds _total to counters); sgl-project/sglang
python/sglang/srt/metrics/collector.py at 00ae9c1 (labels model_name, tp_rank, pp_rank, dp_rank, ...);
triton-inference-server/server docs/user_guide/metrics.md at 067c1e9 ("By default, the following
Counter metrics are used for latencies"); huggingface/text-generation-inference router/src/infer/mod.rs
(tgi_request_failure{err="overloaded"}).
"""

from __future__ import annotations

import pytest

from gpuscope.collect.serving import EngineScraper, ServingCollector
from gpuscope.detect.services import ServiceAggregator
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.store.duckdb import DuckDBStore

VLLM_DP = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 6.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 80.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 8.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.3
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} {p0}
vllm:prompt_tokens_total{engine="1",model_name="llama"} {p1}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama"} {g}
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="llama"} {q_fast}
vllm:request_queue_time_seconds_bucket{engine="0",le="5.0",model_name="llama"} {q_all}
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="llama"} {q_all}
vllm:request_queue_time_seconds_count{engine="0",model_name="llama"} {q_all}
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 900.0
http_requests_total{handler="/v1/completions",method="POST",status="5xx"} {e5}
"""


def vllm_page(p0: int, p1: int, g: int, q_fast: int, q_all: int, e5: int) -> str:
    return (
        VLLM_DP.replace("{p0}", str(p0))
        .replace("{p1}", str(p1))
        .replace("{g}", str(g))
        .replace("{q_fast}", str(q_fast))
        .replace("{q_all}", str(q_all))
        .replace("{e5}", str(e5))
    )


def test_vllm_data_parallel_engines_are_summed_and_ratios_maxed() -> None:
    scraper = EngineScraper("http://vllm:8000/metrics", "n1")
    ((labels, v),) = scraper.rows(vllm_page(1000, 500, 400, 10, 10, 2), 100.0)
    assert labels["model"] == "llama"
    assert v["inference_queue_depth"] == 86 and v["inference_running_requests"] == 10
    assert v["inference_kv_cache_usage_ratio"] == 0.9
    assert v["inference_prompt_tokens_total"] == 1500 and v["inference_http_5xx_total"] == 2
    ((_, v),) = scraper.rows(vllm_page(2000, 2500, 1400, 10, 110, 5), 110.0)
    assert v["inference_prompt_tokens_per_second"] == pytest.approx(300.0)
    assert v["inference_generation_tokens_per_second"] == pytest.approx(100.0)
    assert v["inference_http_5xx_per_second"] == pytest.approx(0.3)
    # the 100 new requests all waited 0.5..5 s
    assert 0.5 < v["inference_queue_time_p50_seconds"] <= 5.0


SGLANG = """\
sglang:num_queue_reqs{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 6.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="1",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 6.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="1",moe_ep_rank="0"} 80.0
sglang:num_running_reqs{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 8.0
sglang:num_running_reqs{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="1",moe_ep_rank="0"} 2.0
sglang:token_usage{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 0.2
sglang:token_usage{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="1",moe_ep_rank="0"} 0.7
sglang:num_retracted_requests_total{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 3.0
sglang:prompt_tokens_total{model_name="qwen",tp_rank="0",pp_rank="0",dp_rank="0",moe_ep_rank="0"} 50.0
"""


def test_sglang_dp_ranks_sum_and_tp_ranks_count_once() -> None:
    ((_, v),) = EngineScraper("http://sgl:30000/metrics", "n1").rows(SGLANG, 1.0)
    assert v["inference_queue_depth"] == 86 and v["inference_running_requests"] == 10
    assert v["inference_kv_cache_usage_ratio"] == 0.7
    assert v["inference_preemptions_total"] == 3 and v["inference_prompt_tokens_total"] == 50


TRITON = """\
nv_inference_request_success{model="resnet",version="1"} {n}
nv_inference_request_failure{model="resnet",reason="REJECTED",version="1"} {rej}
nv_inference_request_failure{model="resnet",reason="BACKEND",version="1"} 1
nv_inference_count{model="resnet",version="1"} {n}
nv_inference_exec_count{model="resnet",version="1"} {n}
nv_inference_request_duration_us{model="resnet",version="1"} {dur}
nv_inference_queue_duration_us{model="resnet",version="1"} {queue}
nv_inference_compute_infer_duration_us{model="resnet",version="1"} 1
nv_inference_pending_request_count{model="resnet",version="1"} 3
"""


def triton_page(n: int, rej: int, dur: int, queue: int) -> str:
    return (TRITON.replace("{n}", str(n)).replace("{rej}", str(rej)).replace("{dur}", str(dur))).replace(
        "{queue}", str(queue)
    )


def test_triton_default_counters_give_mean_latency_and_queue_time() -> None:
    scraper = EngineScraper("http://triton:8002/metrics", "n1")
    scraper.rows(triton_page(100, 0, 1_000_000, 100_000), 100.0)
    ((labels, v),) = scraper.rows(triton_page(300, 5, 5_000_000, 500_000), 110.0)
    assert (labels["model"], labels["version"]) == ("resnet", "1")
    assert v["inference_latency_mean_seconds"] == pytest.approx(0.02)  # 4e6 us over 200 requests
    assert v["inference_queue_time_mean_seconds"] == pytest.approx(0.002)
    assert v["inference_rejections_per_second"] == pytest.approx(0.5)
    assert v["inference_queue_depth"] == 3


def test_each_engine_keeps_its_own_queue_and_kv_series() -> None:
    """One saturated engine among idle ones: the model's row sums and maxes, its engines' rows show
    which one (vLLM ``engine`` and SGLang ``dp_rank`` become ``dp_rank``; tp ranks count once)."""
    models, engines = EngineScraper("http://vllm:8000/metrics", "n1").scrape(vllm_page(1, 1, 1, 1, 1, 0), 1.0)
    assert [v["inference_queue_depth"] for _, v in models] == [86]
    by_rank = {labels["dp_rank"]: (labels, v) for labels, v in engines}
    assert set(by_rank) == {"0", "1"}
    labels, v = by_rank["1"]
    assert (labels["service"], labels["model"], labels["engine"]) == ("llama", "llama", "vllm")
    assert v == {
        "inference_engine_queue_depth": 80.0,
        "inference_engine_running_requests": 2.0,
        "inference_engine_kv_cache_usage_ratio": 0.3,
    }
    assert by_rank["0"][1]["inference_engine_kv_cache_usage_ratio"] == 0.9
    _, engines = EngineScraper("http://sgl:30000/metrics", "n1").scrape(SGLANG, 1.0)
    sgl = {(labels["dp_rank"], labels["pp_rank"]): v for labels, v in engines}
    assert sgl[("0", "0")]["inference_engine_queue_depth"] == 6  # two tp ranks of one scheduler
    assert sgl[("1", "0")]["inference_engine_queue_depth"] == 80
    assert sgl[("1", "0")]["inference_engine_kv_cache_usage_ratio"] == 0.7
    # a single engine is the model's row: no per-engine copy
    one = "\n".join(line for line in vllm_page(1, 1, 1, 1, 1, 0).splitlines() if 'engine="1"' not in line)
    assert EngineScraper("http://v:8000/metrics", "n1").scrape(one + "\n", 1.0)[1] == []


def test_per_engine_rows_are_a_frame_of_their_own_and_never_counted_twice() -> None:
    done = 'vllm:request_success_total{{engine="{e}",finished_reason="stop",model_name="llama"}} {n}\n'
    pages = iter(
        vllm_page(1, 1, 1, 1, 1, 0) + done.format(e=0, n=n) + done.format(e=1, n=n) for n in (10, 30)
    )
    collector = ServingCollector("n1", urls=["http://vllm:8000/metrics"], fetch=lambda url: next(pages))
    collector.collect(1.0)
    got = collector.collect(2.0)  # the second has rates, which make the model's row a service row
    collector.close()
    assert len(got.frames) == 2
    models, engines = got.frames
    assert "inference_engine_queue_depth" not in models.metrics
    assert engines.metrics == [
        "inference_engine_queue_depth",
        "inference_engine_running_requests",
        "inference_engine_kv_cache_usage_ratio",
    ]
    aggregator = ServiceAggregator()
    for f in got.frames:
        aggregator.on_frame(f)
    snap = aggregator.snapshots()["llama"]
    assert (snap.queue, snap.kv) == (86.0, 0.9)


def test_triton_mean_latency_feeds_the_latency_regression_rule() -> None:
    """Triton by default has no latency histogram or summary, only the cumulative microseconds
    (docs/user_guide/metrics.md at 067c1e9): the mean since the last scrape stands in for p95."""
    page = {"n": 0, "dur": 0}

    def fetch(url: str) -> str:
        return triton_page(page["n"], 0, page["dur"], page["dur"] // 10)

    collector = ServingCollector("n1", urls=["http://triton:8002/metrics#service=vision"], fetch=fetch)
    hub = Hub(DuckDBStore(":memory:"))
    t0, fired_at = 1_700_000_000.0, None
    try:
        for step in range(0, 900, 5):
            latency_us = 20_000 if step < 600 else 80_000  # 20 ms, then 80 ms from t0 + 600 s
            page["n"] += 100
            page["dur"] += 100 * latency_us
            got = collector.collect(t0 + step)
            hub.ingest(Batch("n1", frames=got.frames))
            hub.evaluate(t0 + step)
            firing = [a for a in hub.firing() if a.rule == "inference_latency_regression"]
            if firing and fired_at is None:
                fired_at = step
                assert firing[0].entity == {"service": "vision"}
                assert "mean latency" in firing[0].summary
        assert fired_at is not None and 600 < fired_at < 700
    finally:
        collector.close()
        hub.store.close()
