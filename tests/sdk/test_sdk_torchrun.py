"""Real torchrun (3 CPU ranks over gloo) running the README's SDK snippet, against a real hub.

Each way a job ends is checked by the exact alerts it raises (rule, entity, count): a raised
exception, a SIGKILLed rank and a SIGTERM from outside each raise one ``job_failed`` naming the
first rank to fail and its real cause, with no knock-on ``rank_lost`` or ``training_stalled``; a
clean finish raises nothing; a slow rank is named a straggler with no ``track_collectives`` call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk.hubquery import events, records
from support import HubProcess, wait_until

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("torchrun_worker.py")
HOST = socket.gethostname()
#: long enough after the failure for rank_lost (4 s of silence) or a stall to have fired if they would
QUIET_AFTER = 7.0


class Torchrun:
    def __init__(self, tmp: Path, hub: str, job: str, mode: str, steps: int, **extra: str) -> None:
        self.hub, self.job = hub, job
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES="",  # CPU ranks, GPUs on this machine or not: their alerts name no GPU
            GPUSCOPE_HUB=hub,
            GPUSCOPE_JOB=job,
            XDG_STATE_HOME=str(tmp / "state"),
            OMP_NUM_THREADS="1",
            MODE=mode,
            STEPS=str(steps),
            **extra,
        )
        self.log = tmp / f"{job}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
        cmd += ["--monitor-interval", "0.1", str(WORKER)]
        with self.log.open("wb") as out:
            # its own process group: the ranks it starts are ended with it, whatever state the test left
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def __enter__(self) -> Torchrun:
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def alerts(self) -> list[dict[str, Any]]:
        rows = httpx.get(f"{self.hub}/api/v1/alerts", params={"state": "all"}, timeout=10).json()["alerts"]
        return [a for a in rows if a["entity"].get("job") == self.job]

    def rules(self) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
        return Counter((a["rule"], tuple(sorted(a["entity"].items()))) for a in self.alerts())

    def one_failure(self, timeout: float = 90) -> dict[str, Any]:
        """The job's job_failed alert, once alone and stable: nothing else follows it."""
        try:
            wait_until(lambda: any(a["rule"] == "job_failed" for a in self.alerts()), timeout, "job_failed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output()}") from None
        time.sleep(QUIET_AFTER)
        assert self.rules() == {("job_failed", (("job", self.job),)): 1}, (self.alerts(), self.output())
        return self.alerts()[0]


def test_raised_exception_is_one_job_failed_naming_the_rank_and_exception(
    tmp_path: Path, sdk_hub: HubProcess
) -> None:
    with Torchrun(tmp_path, sdk_hub.url, "tr-raise", "raise", 400, FAULT_RANK="1", FAULT_STEP="5") as job:
        alert = job.one_failure()
        assert job.proc.wait(30) != 0
    details = alert["details"]
    assert details["first_rank"] == 1 and details["cause"] == "exception", details
    assert details["reason"] == "RuntimeError: injected fault at step 5"
    assert "rank 1 (" in alert["summary"] and "RuntimeError: injected fault at step 5" in alert["summary"]
    assert details["death_order"][0]["rank"] == 1
    failed = events(sdk_hub.url, "tr-raise", "job_failed")
    own = [e for e in failed if e["labels"]["rank"] == "1"]
    assert len(own) == 1 and own[0]["data"]["exception"] == "RuntimeError" and own[0]["data"]["step"] == 5


def test_sigkilled_rank_is_named_first_in_one_job_failed(tmp_path: Path, sdk_hub: HubProcess) -> None:
    with Torchrun(tmp_path, sdk_hub.url, "tr-kill", "kill", 400, FAULT_RANK="2", FAULT_STEP="5") as job:
        alert = job.one_failure()
        assert job.proc.wait(30) != 0
    details = alert["details"]
    assert details["first_rank"] == 2 and details["cause"] == "silent", details
    assert details["death_order"][0]["rank"] == 2
    assert {d["rank"] for d in details["death_order"]} == {0, 1, 2}
    summary = f"Job tr-kill failed: rank 2 ({HOST} CPU) stopped without last words"
    assert alert["summary"].startswith(summary), alert["summary"]


def test_sigterm_from_outside_is_one_job_failed_with_the_signal(tmp_path: Path, sdk_hub: HubProcess) -> None:
    with Torchrun(tmp_path, sdk_hub.url, "tr-term", "wait", 100_000) as job:

        def training() -> bool:
            return {r["rank"] for r in records(sdk_hub.url, "tr-term") if int(r["step"]) >= 3} == {0, 1, 2}

        wait_until(training, 60, "every rank training", interval=0.5)
        job.proc.send_signal(signal.SIGTERM)
        alert = job.one_failure()
        assert job.proc.wait(30) != 0
    details = alert["details"]
    assert details["cause"] == "signal" and details["reason"] == "terminated by SIGTERM", details
    assert details["first_rank"] in (0, 1, 2)
    failed = events(sdk_hub.url, "tr-term", "job_failed")
    assert sorted(e["labels"]["rank"] for e in failed) == ["0", "1", "2"]
    assert all(e["data"]["signal"] == "SIGTERM" for e in failed)


def test_clean_finish_raises_nothing(tmp_path: Path, sdk_hub: HubProcess) -> None:
    with Torchrun(tmp_path, sdk_hub.url, "tr-clean", "clean", 12) as job:
        assert job.proc.wait(90) == 0, job.output()
    wait_until(lambda: events(sdk_hub.url, "tr-clean", "job_ended"), 10, "job_ended")
    time.sleep(QUIET_AFTER)
    assert job.alerts() == []
    assert not events(sdk_hub.url, "tr-clean", "job_failed")


def test_readme_only_straggler_is_named(tmp_path: Path, sdk_hub: HubProcess) -> None:
    slow = 0.112
    with Torchrun(tmp_path, sdk_hub.url, "tr-slow", "slow", 45, FAULT_RANK="1", SLOW=str(slow)) as job:
        assert job.proc.wait(120) == 0, job.output()
    wait_until(lambda: events(sdk_hub.url, "tr-slow", "job_ended"), 10, "job_ended")
    straggler = [a for a in job.alerts() if a["rule"] == "training_straggler"]
    entity = {"job": "tr-slow", "rank": "1", "node": HOST}  # a CPU rank: no gpu label
    assert job.rules() == {("training_straggler", tuple(sorted(entity.items()))): 1}, job.alerts()
    lag_seconds = straggler[0]["details"]["lag_seconds"]
    assert abs(lag_seconds - slow) < 0.03, straggler[0]
