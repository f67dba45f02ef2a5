"""A CPU-only rank through the SDK, the hub and its alerts: no GPU is named anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gpuscope.sdk.env import detect_placement
from gpuscope.sdk.run import Run
from gpuscope.web.server import HubServer
from sdk.hubquery import events, records
from support import wait_until


def _alerts(hub: str, job: str) -> list[dict[str, Any]]:
    rows = httpx.get(f"{hub}/api/v1/alerts", params={"state": "all"}, timeout=10).json()["alerts"]
    return [a for a in rows if a["entity"].get("job") == job]


def test_cpu_ranks_failure_names_no_gpu(tmp_path: Path, local_hub: HubServer) -> None:
    """Seen: "rank 2 on node-1 GPU 0" for a rank with no CUDA device."""
    job, runs = "cpu-only", []
    for rank in range(3):
        # torchrun's environment for CPU ranks: CUDA_VISIBLE_DEVICES hides every device
        env = {"GPUSCOPE_JOB": job, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3"}
        placement = detect_placement({**env, "NODE_NAME": "node-1", "CUDA_VISIBLE_DEVICES": ""})
        state = tmp_path / str(rank)
        runs.append(Run(placement, local_hub.url, state_dir=state, flush_interval=0.05, last_words=False))
    for step in range(3):
        for run in runs:
            run.log(step, loss=1.0)
    runs[2].finish(ok=False, reason="RuntimeError: boom")
    runs[0].finish(ok=False, reason="terminated by SIGTERM")
    runs[1].finish(ok=False, reason="terminated by SIGTERM")

    rows = records(local_hub.url, job)
    assert rows and all(r["labels"] == {"node": "node-1"} for r in rows)
    [started] = events(local_hub.url, job, "job_started")
    assert started["data"]["placement"] == [[0, "node-1", ""]]
    failed = events(local_hub.url, job, "job_failed")
    assert {e["labels"]["rank"] for e in failed} == {"0", "1", "2"}
    assert all("gpu" not in e["labels"] for e in failed)

    def failure() -> list[dict[str, Any]]:
        return [a for a in _alerts(local_hub.url, job) if a["rule"] == "job_failed"]

    wait_until(failure, 20, "job_failed")
    [alert] = failure()
    assert alert["entity"] == {"job": job}
    root = f"Job {job} failed: rank 2 (node-1 CPU) failed first: RuntimeError: boom"
    assert alert["summary"].startswith(root), alert["summary"]
    assert "GPU" not in alert["summary"]
    assert alert["details"]["links"] == [{"node": "node-1"}]
    assert {d["gpu"] for d in alert["details"]["death_order"]} == {""}
