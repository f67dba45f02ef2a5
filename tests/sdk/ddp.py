"""Launching a 3-rank DDP job of real processes, torchrun-style, against a real hub."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from support import free_port

WORKER = Path(__file__).with_name("ddp_worker.py")
#: rank -> (node, local rank): two ranks on node-a, one on node-b
PLACEMENT = {0: ("node-a", 0), 1: ("node-a", 1), 2: ("node-b", 0)}


class DdpJob:
    def __init__(self, tmp: Path, hub: str, job: str, mode: str, steps: int, **extra: str) -> None:
        self.job, self.hub = job, hub
        port = free_port()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Path] = {}
        # each node's ranks stand for GPU ranks: CUDA_VISIBLE_DEVICES names their GPUs, which the
        # CPU build of torch ignores
        base = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(PLACEMENT)))}
        for rank, (node, local) in PLACEMENT.items():
            env = {
                **base,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(len(PLACEMENT)),
                "LOCAL_RANK": str(local),
                "GPUSCOPE_HUB": hub,
                "GPUSCOPE_JOB": job,
                "GPUSCOPE_NODE": node,
                "XDG_STATE_HOME": str(tmp / "state"),
                "OMP_NUM_THREADS": "1",
                "MODE": mode,
                "STEPS": str(steps),
                **extra,
            }
            self.logs[rank] = tmp / f"{job}-rank{rank}.log"
            with self.logs[rank].open("wb") as out:
                self.procs[rank] = subprocess.Popen(
                    [sys.executable, str(WORKER)], env=env, stdout=out, stderr=subprocess.STDOUT
                )

    def wait(self, timeout: float) -> dict[int, int]:
        return {rank: p.wait(timeout) for rank, p in self.procs.items()}

    def output(self) -> str:
        return "\n".join(f"--- rank {r}\n{p.read_text(errors='replace')}" for r, p in self.logs.items())

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(30)

    # -- what the hub knows -----------------------------------------------------------------------

    def alerts(self) -> list[dict[str, object]]:
        rows = httpx.get(f"{self.hub}/api/v1/alerts", params={"state": "all"}, timeout=10).json()["alerts"]
        return [a for a in rows if a["entity"].get("job") == self.job]

    def records(self) -> list[dict[str, object]]:
        params = {"job": self.job, "start": 0, "end": 4e9, "limit": 100_000}
        return list(httpx.get(f"{self.hub}/api/v1/training", params=params, timeout=10).json()["records"])

    def events(self, kind: str) -> list[dict[str, object]]:
        params = {"kind": kind, "start": 0, "end": 4e9, "job": self.job, "limit": 100_000}
        return list(httpx.get(f"{self.hub}/api/v1/events", params=params, timeout=10).json()["events"])
