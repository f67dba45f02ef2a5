"""Launching a 3-rank DDP job of real processes, torchrun-style, against a real hub (ddp_worker.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from support import free_port, wait_until

WORKER = Path(__file__).with_name("ddp_worker.py")
#: rank -> (node, local rank): two ranks on node-a, one on node-b
PLACEMENT = {0: ("node-a", 0), 1: ("node-a", 1), 2: ("node-b", 0)}


class DdpJob:
    def __init__(self, tmp: Path, hub: str, job: str, mode: str, steps: int, **extra: str) -> None:
        self.job, self.hub = job, hub
        self.logs = {rank: tmp / f"{job}-rank{rank}.log" for rank in PLACEMENT}
        self.status = tmp / f"{job}.status"
        self.status.touch()
        ranks = {rank: [node, local, str(self.logs[rank])] for rank, (node, local) in PLACEMENT.items()}
        env = {
            **os.environ,
            # each node's ranks stand for GPU ranks: CUDA_VISIBLE_DEVICES names their GPUs, which the
            # CPU build of torch ignores
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(PLACEMENT))),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(len(PLACEMENT)),
            "RANKS": json.dumps(ranks),
            "STATUS_FILE": str(self.status),
            "GPUSCOPE_HUB": hub,
            "GPUSCOPE_JOB": job,
            "XDG_STATE_HOME": str(tmp / "state"),
            "OMP_NUM_THREADS": "1",
            "MODE": mode,
            "STEPS": str(steps),
            **extra,
        }
        self.launcher_log = tmp / f"{job}-launcher.log"
        with self.launcher_log.open("wb") as out:
            # its own process group: the ranks it forks are ended with it, whatever state the test left
            self.launcher = subprocess.Popen(
                [sys.executable, str(WORKER)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def exit_codes(self) -> dict[int, int]:
        """rank -> exit code of the ranks that have ended (minus the signal's number when killed)."""
        lines = self.status.read_text().splitlines()
        return {int(rank): int(code) for rank, code in (line.split() for line in lines)}

    def wait(self, timeout: float) -> dict[int, int]:
        self.launcher.wait(timeout)
        return self.exit_codes()

    def wait_rank(self, rank: int, timeout: float) -> int:
        wait_until(lambda: rank in self.exit_codes(), timeout, f"rank {rank} to end")
        return self.exit_codes()[rank]

    def output(self) -> str:
        logs = {"launcher": self.launcher_log, **{f"rank {r}": p for r, p in self.logs.items()}}
        return "\n".join(
            f"--- {name}\n{p.read_text(errors='replace')}" for name, p in logs.items() if p.exists()
        )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.launcher.pid, signal.SIGKILL)
        self.launcher.wait(30)

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
