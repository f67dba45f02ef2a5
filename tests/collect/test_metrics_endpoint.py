"""The agent's /metrics: promtool accepts it, and a real Prometheus scrapes it and answers PromQL."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuscope.agent.metrics_endpoint import (
    MetricsEndpoint,
    PublishingCollectorSet,
    parse_listen,
    render_exposition,
)
from gpuscope.collect.fake_nvml import SW_POWER, FakeNvml, FakeProcess
from gpuscope.collect.infiniband import InfinibandCollector
from gpuscope.collect.nvml import NvmlCollector
from support import free_port, need_binary

SYS = Path(__file__).parent / "fixtures" / "sys"


@pytest.fixture
def endpoint() -> Iterator[tuple[MetricsEndpoint, PublishingCollectorSet, FakeNvml]]:
    fake = FakeNvml.healthy(8)
    fake.gpus[3].temp, fake.gpus[3].power_mw = 71, 655_500
    fake.throttle(5, SW_POWER)
    fake.gpus[2].processes = [FakeProcess(1, 2**30)]
    ep = MetricsEndpoint("127.0.0.1", 0).start()
    cs = PublishingCollectorSet(
        [
            NvmlCollector("node-9", lib=fake, slow_every=1, watch_events=False),
            InfinibandCollector("node-9", sys_root=str(SYS)),
        ],
        ep,
    )
    cs.collect(time.time())
    cs.collect(time.time())
    yield ep, cs, fake
    cs.close()
    ep.close()


def test_promtool_accepts_names_types_and_help(
    endpoint: tuple[MetricsEndpoint, PublishingCollectorSet, FakeNvml],
) -> None:
    promtool = need_binary("promtool", "prometheus")
    ep, _, _ = endpoint
    body = httpx.get(f"http://127.0.0.1:{ep.address[1]}/metrics").text
    assert 'gpu_temp_celsius{gpu="3",node="node-9",uuid="' in body
    assert "# TYPE gpu_ecc_dbe_volatile_total counter" in body
    assert 'ib_port_rx_bytes_total{device="mlx5_0",node="node-9",port="1"} 922159499729932' in body
    check = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_exposition_of_edge_values() -> None:
    import numpy as np

    from gpuscope.model import Frame

    f = Frame(
        1.0, ["gpu_temp_celsius", "x_total"], [{"node": 'a"b\\c', "gpu": "0"}], np.array([[np.nan, 3.5]])
    )
    text = render_exposition([f])
    assert "gpu_temp_celsius" not in text  # NaN: not reported
    assert 'x_total{gpu="0",node="a\\"b\\\\c"} 3.5' in text
    assert parse_listen("[::1]:9470") == ("::1", 9470)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("9470")


def test_unknown_paths_are_404(endpoint: tuple[MetricsEndpoint, PublishingCollectorSet, FakeNvml]) -> None:
    ep, _, _ = endpoint
    assert httpx.get(f"http://127.0.0.1:{ep.address[1]}/other").status_code == 404


@pytest.mark.integration
def test_real_prometheus_scrapes_the_agent_and_answers_promql(
    endpoint: tuple[MetricsEndpoint, PublishingCollectorSet, FakeNvml], tmp_path: Path
) -> None:
    prometheus = need_binary("prometheus", "prometheus")
    ep, _, _ = endpoint
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpuscope-agent\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{ep.address[1]}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = 'gpu_power_watts{node="node-9",gpu="3"}'
        result: list[dict[str, object]] = []
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            try:
                got = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}, timeout=2
                ).json()
                result = got["data"]["result"]
            except (httpx.HTTPError, KeyError, ValueError):
                continue
        assert result, "Prometheus never had the series"
        assert float(result[0]["value"][1]) == pytest.approx(655.5)  # type: ignore[index]
        throttled = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/query", params={"query": "sum(gpu_throttle_sw_power)"}, timeout=2
        ).json()["data"]["result"]
        assert float(throttled[0]["value"][1]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
