"""Serving engines as a source: the four engines' fixtures, renamed names, percentiles, rates, the agent."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.agent.cli import add_agent_arguments, run_agent
from gpuscope.collect.base import CollectorContext, build_collectors, enabled_collectors
from gpuscope.collect.serving import EngineScraper, ServingCollector, split_target
from gpuscope.collect.serving_map import bucket_quantile
from support import QuietHandler, loopback_http

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}_metrics.txt").read_text()


def rows(text: str, target: str = "http://engine:8000/metrics") -> dict[str, dict[str, float]]:
    url, options = split_target(target)
    scraper = EngineScraper(url, "node-0", options)
    return {labels["service"]: values for labels, values in scraper.rows(text, 100.0)}


def test_vllm_fixture_maps_to_the_schema() -> None:
    got = rows(fixture("vllm"), "http://engine:8000/metrics#service=chat&version=v7&kv_block_bytes=1024")
    v = got["chat"]
    assert v["inference_queue_depth"] == 0 and v["inference_running_requests"] == 0
    assert v["inference_kv_cache_usage_ratio"] == 0 and v["inference_preemptions_total"] == 0
    assert v["inference_requests_total"] == 1  # request_success_total, finished_reason="length"
    assert v["inference_kv_cache_capacity_blocks"] == 7281
    assert v["inference_memory_kv_cache_bytes"] == 0  # 0 % of 7281 blocks of 1 KiB in use
    # one request in the le=1.0 bucket: Prometheus interpolation puts the median at 0.5 s
    assert v["inference_latency_p50_seconds"] == pytest.approx(0.5)
    assert v["inference_latency_p99_seconds"] == pytest.approx(0.99)
    assert v["inference_ttft_p95_seconds"] == pytest.approx(0.4875)
    assert (
        0 < v["inference_itl_p50_seconds"] < v["inference_itl_p95_seconds"] < v["inference_itl_p99_seconds"]
    )


def test_vllm_new_names_win_and_old_names_are_accepted_alone() -> None:
    text = fixture("vllm")
    both = rows(text)["facebook/opt-125m"]
    new_only = "\n".join(
        ln for ln in text.splitlines() if "time_per_output_token" not in ln and "gpu_cache_usage" not in ln
    )
    old_only = "\n".join(
        ln for ln in text.splitlines() if "inter_token_latency" not in ln and "kv_cache_usage_perc" not in ln
    )
    assert (
        rows(new_only)["facebook/opt-125m"]["inference_itl_p95_seconds"] == both["inference_itl_p95_seconds"]
    )
    old = rows(
        old_only.replace(
            'gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
            'gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.42',
        )
    )
    assert old["facebook/opt-125m"]["inference_kv_cache_usage_ratio"] == pytest.approx(0.42)
    assert "inference_itl_p95_seconds" in old["facebook/opt-125m"]


def test_triton_fixture_per_model_and_version() -> None:
    got = rows(fixture("triton"))
    assert len(got) == 8
    dense = got["densenet_onnx"]
    assert dense["inference_requests_total"] == 3 and dense["inference_errors_total"] == 0
    assert dense["inference_queue_depth"] == 0
    assert dense["inference_latency_p50_seconds"] == pytest.approx(3e-6)  # summary quantiles, µs -> s
    # summaries over no requests say nothing, so models without requests get no percentiles
    assert "inference_latency_p95_seconds" not in got["simple"]


def test_tgi_and_sglang_fixtures() -> None:
    tgi = rows(fixture("tgi"), "http://tgi:80/metrics#service=summarise&model=mistral-7b")["summarise"]
    assert tgi["inference_queue_depth"] == 4 and tgi["inference_batch_size"] == 12
    assert tgi["inference_requests_total"] == 1200 and tgi["inference_errors_total"] == 10
    assert tgi["inference_latency_p50_seconds"] == pytest.approx(1.0)  # 600 of 1200 at le=1
    assert tgi["inference_latency_p95_seconds"] == pytest.approx(2 + 2 * (1140 - 1100) / 90)
    assert tgi["inference_itl_p50_seconds"] == pytest.approx(0.01 + 0.01 * (600 - 200) / 800)
    sg = rows(fixture("sglang"))["meta-llama/Llama-3.1-8B-Instruct"]
    assert sg["inference_kv_cache_usage_ratio"] == pytest.approx(0.82)
    assert sg["inference_running_requests"] == 28 and sg["inference_queue_depth"] == 7
    assert sg["inference_errors_total"] == 25
    assert sg["inference_ttft_p50_seconds"] == pytest.approx(0.05 + 0.05 * (2500 - 1000) / 2000)
    assert sg["inference_itl_p99_seconds"] == pytest.approx(0.02 + 0.02 * (99000 - 90000) / 10000)


def test_bucket_quantile_edges() -> None:
    assert math.isnan(bucket_quantile({1.0: 0.0, math.inf: 0.0}, 0.5))
    assert math.isnan(bucket_quantile({1.0: 3.0}, 0.5))  # no +Inf bucket: total unknown
    assert bucket_quantile({1.0: 0.0, 2.0: 0.0, math.inf: 5.0}, 0.5) == 2.0  # in +Inf: highest bound
    with pytest.raises(ValueError, match="quantile"):
        bucket_quantile({math.inf: 1.0}, 1.5)


def test_second_scrape_gives_rates_and_window_percentiles() -> None:
    scraper = EngineScraper("http://tgi/metrics", "node-0", {"service": "s"})
    text = fixture("tgi")
    scraper.rows(text, 100.0)
    later = (
        text.replace("tgi_request_success 1200", "tgi_request_success 1300")
        .replace('tgi_request_failure{err="overloaded"} 4', 'tgi_request_failure{err="overloaded"} 14')
        .replace('le="8"} 1200', 'le="8"} 1300')
        .replace('le="+Inf"} 1200\ntgi_request_duration_sum', 'le="+Inf"} 1300\ntgi_request_duration_sum')
    )
    ((_, v),) = scraper.rows(later, 110.0)
    assert v["inference_requests_per_second"] == pytest.approx(10.0)
    assert v["inference_errors_per_second"] == pytest.approx(1.0)
    assert v["inference_rejections_per_second"] == pytest.approx(1.0)  # err="overloaded": refused
    # the 100 new requests all took 4..8 s: the window's median is inside that bucket
    assert 4.0 < v["inference_latency_p50_seconds"] <= 8.0
    # the ITL histogram did not move: no percentiles rather than lifetime ones
    assert "inference_itl_p50_seconds" not in v
    ((_, v),) = scraper.rows(text, 120.0)  # counters went back: an engine restart
    # requests, failures and rejections all went back
    assert scraper.resets == 3 and v["inference_requests_per_second"] == pytest.approx(120.0)


def test_bad_targets_and_expositions_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="http"):
        split_target("engine:8000/metrics")
    with pytest.raises(ValueError, match="unknown fragment"):
        split_target("http://e/metrics#colour=blue")
    c = ServingCollector(
        "n",
        urls=["http://a/metrics", "http://b/metrics"],
        fetch=lambda u: fixture("sglang") if "a" in u.split("//")[1] else "not a metric line {",
    )
    got = c.collect(1.0)
    assert [e.kind for e in got.errors] == ["serving_format"] and len(got.frames) == 1
    none = ServingCollector("n", urls=["http://b/metrics"], fetch=lambda u: "process_cpu_seconds_total 1\n")
    with pytest.raises(RuntimeError, match="no vLLM"):
        none.collect(1.0)


class _Engine(QuietHandler):
    body = b""

    def do_GET(self) -> None:
        self.reply(200, self.body)


@pytest.fixture
def engine_url() -> Iterator[str]:
    _Engine.body = fixture("vllm").encode()
    with loopback_http(_Engine) as url:
        yield f"{url}/metrics"


def test_agent_scrape_flag_once_json(engine_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = CollectorContext(node="n", options={"scrape_urls": [engine_url]})
    assert "serving" in enabled_collectors(ctx)
    assert isinstance(build_collectors(["serving"], ctx)[0], ServingCollector)
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(
        [
            "--once",
            "--json",
            "--collector",
            "serving",
            "--rate-window",
            "0.05",
            "--node",
            "gpu-7",
            "--scrape",
            engine_url + "#service=chat&version=v3",
        ]
    )
    assert run_agent(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"] == ["serving"] and out["errors"] == []
    ((entity, values),) = out["entities"].items()
    assert "service=chat" in entity and "version=v3" in entity and "engine=vllm" in entity
    assert values["inference_requests_per_second"] == 0.0  # two scrapes of a quiet engine
    assert values["inference_kv_cache_usage_ratio"] == 0.0
