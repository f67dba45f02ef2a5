"""A check on a real GPU machine (``scripts/gpu-check.sh``; ``python -m gpuscope.gpucheck OUT``).

1. One agent round on real NVML (``agent --once --json``, the nvml collector, slow counters
   included): every per-GPU field the collector promises (``signals.GPU_METRICS``) is present,
   or NVML said it is not supported on that GPU (recorded with the call that said so), or it is
   missing, which fails the check. Memory, utilization, temperature and power must be there.
2. A short real CUDA training (a small MLP, 60 steps) read by the SDK's own pieces: its
   placement (job and physical GPU, :mod:`gpuscope.identity`) against NVML's view, and its
   allocator sampler (memory allocated/reserved, fragmentation).
3. A trimmed capture (two GPUs at most; no hostnames) saved as ``OUT/capture.json`` to commit as a
   fixture, the report as ``OUT/report.json``, and a one-line verdict.

Exit status: 0 PASS, 1 FAIL, 2 nothing to check (no NVIDIA driver), printed as such.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpuscope.agent.agent import collect_once_json
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.nvml_api import NvmlUnavailable, nvml_library_present, uuid_indices
from gpuscope.sdk.env import detect_placement
from gpuscope.sdk.memory import cuda_memory_sampler
from gpuscope.signals import GPU_METRICS

#: fields without which the collector is not doing its job on any data-centre GPU
REQUIRED = (
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_temp_celsius",
    "gpu_power_watts",
)
NO_GPU = 2


def check_nvml(lib: Any = None, rate_window: float = 1.0) -> dict[str, Any]:
    """One agent round on NVML and the per-GPU field check; raises NvmlUnavailable without NVML."""
    collector = NvmlCollector("gpu-check", lib=lib, slow_every=1, watch_events=False)
    collector.session.open()  # raises NvmlUnavailable here rather than as a collector error
    try:
        capture = collect_once_json([collector], rate_window=rate_window)
        unsupported = sorted(f"{uuid}: {what}" for uuid, what in collector.session.unsupported)
    finally:
        collector.close()
    gpus: dict[str, Any] = {}
    for key, row in capture["entities"].items():
        labels = dict(part.split("=", 1) for part in key.split(","))
        if "gpu" not in labels or {"pid", "link", "mig"} & set(labels):
            continue
        uuid = labels.get("uuid", "")
        why = [u for u in unsupported if u.startswith(uuid)]
        missing = [m for m in GPU_METRICS if m not in row]
        gpus[labels["gpu"]] = {
            "uuid": uuid,
            "present": sorted(m for m in GPU_METRICS if m in row),
            "missing": missing,
            "missing_required": [m for m in REQUIRED if m not in row],
            "unsupported_calls": why,
        }
    return {"gpus": gpus, "errors": capture["errors"], "capture": capture}


def train(steps: int = 60) -> dict[str, Any]:
    """A short CUDA training read by the SDK's placement and memory sampler; ``skipped`` without CUDA."""
    try:
        import torch  # optional: the check runs without PyTorch, and says so
    except ImportError:
        return {"skipped": "PyTorch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "torch.cuda.is_available() is False"}
    placement = detect_placement({"GPUSCOPE_JOB": "gpu-check", **os.environ}, uuid_index=uuid_indices)
    device = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(
        device
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = cuda_memory_sampler(0)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(256, 1024, device=device)
        y = torch.randint(0, 10, (256,), device=device)
        loss: Any = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    memory = sampler() if sampler is not None else {}
    return {
        "steps": steps,
        "seconds": time.perf_counter() - start,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "placement": {"job": placement.job, "gpu": placement.gpu, "gpu_uuid": placement.gpu_uuid},
        "device_name": torch.cuda.get_device_name(0),
        "memory": memory,
    }


def trim(capture: dict[str, Any], keep: int = 2) -> dict[str, Any]:
    """The capture with at most ``keep`` GPUs (and their links/processes) and no host name."""
    gpus = sorted(
        {dict(p.split("=", 1) for p in k.split(",")).get("gpu", "") for k in capture["entities"]} - {""}
    )
    kept = set(gpus[:keep])
    entities = {}
    for key, row in capture["entities"].items():
        labels = dict(p.split("=", 1) for p in key.split(","))
        if labels.get("gpu") in kept:
            labels["node"] = "gpu-node"
            entities[",".join(f"{k}={v}" for k, v in labels.items())] = row
    return {**capture, "entities": entities, "events": capture["events"][:20]}


def verdict(report: dict[str, Any]) -> tuple[str, int]:
    gpus = report["nvml"]["gpus"]
    if not gpus:
        return "FAIL: NVML started but the agent reported no GPU", 1
    bad = {g: v["missing_required"] for g, v in gpus.items() if v["missing_required"]}
    if bad:
        return f"FAIL: required fields missing: {bad}", 1
    training = report["training"]
    if "skipped" in training:
        return f"FAIL: the training check could not run ({training['skipped']})", 1
    if not training["memory"].get("memory_allocated_bytes"):
        return "FAIL: the SDK's allocator sampler read no memory", 1
    missing = sum(len(v["missing"]) for v in gpus.values())
    return f"PASS: {len(gpus)} GPU(s); {missing} optional field(s) absent (see report.json)", 0


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "gpu-check-out")
    if not nvml_library_present():
        print("gpu-check: NO GPU: the NVIDIA driver's NVML library (libnvidia-ml.so) is not on this machine")
        return NO_GPU
    try:
        nvml = check_nvml()
    except NvmlUnavailable as exc:
        print(f"gpu-check: NO GPU: {exc}")
        return NO_GPU
    report: dict[str, Any] = {"nvml": {k: v for k, v in nvml.items() if k != "capture"}, "training": train()}
    text, status = verdict(report)
    report["verdict"] = text
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "capture.json").write_text(json.dumps(trim(nvml["capture"]), indent=1, default=str))
    print(f"gpu-check: {text}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
