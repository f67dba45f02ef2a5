"""A real Alertmanager (Debian prometheus-alertmanager) on a free loopback port, temp config and storage."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from support import free_port, need_binary

BINARY = "prometheus-alertmanager"


def need_alertmanager() -> str:
    return need_binary(BINARY, "prometheus-alertmanager")


class Alertmanager:
    def __init__(self, workdir: Path, webhook_url: str) -> None:
        binary = need_alertmanager()
        self.port = free_port()
        config = workdir / "alertmanager.yml"
        config.write_text(
            "route:\n"
            "  receiver: hook\n"
            "  group_by: ['alertname', 'node', 'gpu']\n"
            "  group_wait: 0s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            "receivers:\n"
            "  - name: hook\n"
            "    webhook_configs:\n"
            f"      - url: '{webhook_url}'\n"
            "        send_resolved: true\n"
        )
        self.log = (workdir / "alertmanager.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(
                    f"alertmanager did not start: {(workdir / 'alertmanager.log').read_text()}"
                )
            time.sleep(0.1)

    def alerts(self, **params: str) -> list[dict[str, object]]:
        response = httpx.get(f"{self.url}/api/v2/alerts", params=params, timeout=5)
        response.raise_for_status()
        return list(response.json())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
