"""The /metrics text the dcgm and serving collectors scrape: one keep-alive connection per
collector, an error status raised, and the client closed with the collector."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import httpx
import pytest

from gpuscope.collect.dcgm import DcgmCollector
from gpuscope.collect.httptext import HttpText
from gpuscope.collect.serving import ServingCollector
from support import QuietHandler, loopback_http

PAGE = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 42\n'


class _Exporter(QuietHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as exporters answer
    connections: ClassVar[list[str]] = []  # one handler per connection, made as it is accepted

    def setup(self) -> None:
        super().setup()
        _Exporter.connections.append(str(self.client_address))

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self.reply(200, PAGE)
        else:
            self.reply(500, b"no such page\n")


@pytest.fixture
def exporter() -> Iterator[str]:
    _Exporter.connections.clear()
    with loopback_http(_Exporter) as url:
        yield url


def test_pages_come_over_one_connection_and_an_error_status_raises(exporter: str) -> None:
    http = HttpText(timeout=5.0)
    assert http.get(f"{exporter}/metrics") == PAGE.decode()
    assert http.get(f"{exporter}/metrics") == PAGE.decode()
    assert len(_Exporter.connections) == 1
    with pytest.raises(httpx.HTTPStatusError):
        http.get(f"{exporter}/broken")
    http.close()
    assert http.get(f"{exporter}/metrics") == PAGE.decode()  # opened again after a close
    assert len(_Exporter.connections) == 2
    http.close()
    http.close()  # twice is harmless, as a collector may be closed twice


def test_the_dcgm_and_serving_collectors_scrape_over_it(exporter: str) -> None:
    dcgm = DcgmCollector("n1", url=f"{exporter}/metrics")
    (frame,) = dcgm.collect(1.0).frames
    assert frame.metrics == ["gpu_utilization_percent"] and frame.values.tolist() == [[42.0]]
    dcgm.close()
    serving = ServingCollector("n1", urls=[f"{exporter}/broken"])
    with pytest.raises(RuntimeError, match="500"):
        serving.collect(1.0)
    serving.close()
