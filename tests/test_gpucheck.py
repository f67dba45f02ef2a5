"""scripts/gpu-check.sh: what it checks, on the faithful fake NVML, and that it says so plainly
on a machine without a GPU (this one; CI's too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscope.collect.fake_nvml import FakeNvml
from gpuscope.collect.nvml_api import nvml_library_present
from gpuscope.gpucheck import check_nvml, trim, verdict

ROOT = Path(__file__).parents[1]


@pytest.mark.skipif(nvml_library_present(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_the_script_says_so_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "NO GPU" in done.stdout and "libnvidia-ml.so" in done.stdout
    assert not (tmp_path / "out").exists()


def test_every_promised_field_is_checked_on_the_fake() -> None:
    fake = FakeNvml.healthy(4)
    fake.gpus[1].unsupported = {"nvmlDeviceGetPowerUsage"}
    got = check_nvml(lib=fake, rate_window=0)
    assert sorted(got["gpus"]) == ["0", "1", "2", "3"]
    assert got["gpus"]["0"]["missing_required"] == []
    g1 = got["gpus"]["1"]
    assert g1["missing_required"] == ["gpu_power_watts"]
    assert any("power" in call for call in g1["unsupported_calls"])  # why it is missing
    report = {"nvml": got, "training": {"memory": {"memory_allocated_bytes": 1.0}}}
    text, status = verdict(report)
    assert status == 1 and "gpu_power_watts" in text
    fake.gpus[1].unsupported = set()
    text, status = verdict({"nvml": check_nvml(lib=fake, rate_window=0), "training": {"skipped": "no CUDA"}})
    assert status == 1 and "no CUDA" in text


def test_the_capture_is_trimmed_to_two_gpus_without_the_host_name() -> None:
    capture = check_nvml(lib=FakeNvml.healthy(4), rate_window=0)["capture"]
    small = trim(capture)
    gpus = {dict(p.split("=", 1) for p in k.split(","))["gpu"] for k in small["entities"]}
    assert gpus == {"0", "1"}
    assert all("node=gpu-node" in k for k in small["entities"])
