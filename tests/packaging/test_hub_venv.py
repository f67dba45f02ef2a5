"""The hub alone, from the wheel with the `hub` extra and constraints.txt, in a fresh venv: it starts,
serves, and the developer toolchain is not part of it (the `make demo` install)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from packaging_support import build_wheel, fresh_venv, uv_pip
from support import free_port, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_hub_extra_alone_in_a_fresh_venv_starts_a_hub(tmp_path: Path) -> None:
    wheel = build_wheel(ROOT, tmp_path)
    env_dir = tmp_path / "venv"
    python = fresh_venv(env_dir)
    bin_dir = env_dir / "bin"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "GPUSCOPE_TOKEN")}
    uv_pip(python, "install", ["-q", "--constraint", ROOT / "constraints.txt", f"{wheel}[hub]"], clean, 900)
    installed = uv_pip(python, "freeze", [], clean).lower()
    for dev_only in ("torch", "transformers", "playwright", "pytest", "mypy"):
        assert f"\n{dev_only}==" not in f"\n{installed}", f"the hub install pulled in {dev_only}"
    config = tmp_path / "hub.yaml"
    config.write_text("pricing: {price_per_gpu_hour: 3}\n")
    check = subprocess.run(
        [bin_dir / "gpuscope", "config", "check", config], capture_output=True, text=True, env=clean
    )
    assert check.returncode == 0 and f"{config}: ok" in check.stdout, check.stderr
    port = free_port()
    log = (tmp_path / "hub.log").open("wb")
    hub = subprocess.Popen(
        [
            bin_dir / "gpuscope",
            "hub",
            "--config",
            config,
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            tmp_path / "h.duckdb",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=clean,
        cwd=tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200, 60, "the hub")
        assert "gpuscope_hub_build_info" in httpx.get(f"{url}/metrics").text
        assert httpx.get(f"{url}/prometheus/api/v1/labels").json()["status"] == "success"
    finally:
        hub.terminate()
        hub.wait(timeout=30)
        log.close()
