"""A rank's last words: exception and SIGTERM hooks report the cause, chain what was installed
before, and leave the process's exit status as it would be without the SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpuscope.web.server import HubServer
from sdk.hubquery import events
from support import wait_until

SCRIPT = """
import os, signal, sys, threading, time
import gpuscope
mode = sys.argv[1]
if mode == "chained":
    signal.signal(signal.SIGTERM, lambda s, f: (print("previous handler ran", flush=True), sys.exit(7)))
run = gpuscope.init(job=sys.argv[2], hub=sys.argv[3], rank=int(sys.argv[4]), world_size=2, node="n",
                    state_dir=sys.argv[5], flush_interval=0.05)
run.log(3, loss=1.0)
if mode == "thread_then_raise":
    t = threading.Thread(target=lambda: 1 / 0, name="loader")
    t.start(); t.join()
if mode in ("raise", "thread_then_raise"):
    raise KeyError("missing shard")
if mode == "with":
    with run:
        raise ValueError("bad batch")
print("ready", flush=True)
time.sleep(60)
"""


def _spawn(tmp: Path, hub: HubServer, job: str, mode: str, rank: int = 1) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", textwrap.dedent(SCRIPT), mode, job, hub.url, str(rank), str(tmp / job)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""


def _failure(hub: HubServer, job: str) -> dict[str, object]:
    wait_until(lambda: events(hub.url, job, "job_failed"), 20, f"{job}'s job_failed")
    [event] = events(hub.url, job, "job_failed")
    return event


def test_uncaught_exception_is_reported_with_type_and_message(tmp_path: Path, local_hub: HubServer) -> None:
    proc = _spawn(tmp_path, local_hub, "lw-raise", "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1  # as without the SDK
    assert "KeyError: 'missing shard'" in err  # the previous excepthook printed the traceback
    event = _failure(local_hub, "lw-raise")
    assert event["labels"] == {"job": "lw-raise", "rank": "1", "node": "n", "gpu": "1"}
    assert event["data"]["cause"] == "exception" and event["data"]["exception"] == "KeyError"
    assert event["data"]["reason"] == "KeyError: 'missing shard'" and event["data"]["step"] == 3


def test_a_thread_error_is_named_in_the_last_words(tmp_path: Path, local_hub: HubServer) -> None:
    proc = _spawn(tmp_path, local_hub, "lw-thread", "thread_then_raise")
    proc.communicate(timeout=60)
    event = _failure(local_hub, "lw-thread")
    assert event["data"]["reason"] == (
        "KeyError: 'missing shard' (after ZeroDivisionError: division by zero in thread loader)"
    )


def test_sigterm_is_reported_and_still_terminates(tmp_path: Path, local_hub: HubServer) -> None:
    proc = _spawn(tmp_path, local_hub, "lw-term", "wait")
    _ready(proc)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # the default action still ends it
    event = _failure(local_hub, "lw-term")
    assert event["data"]["cause"] == "signal" and event["data"]["signal"] == "SIGTERM"
    assert event["data"]["reason"] == "terminated by SIGTERM" and event["data"]["exit_code"] == 143
    assert abs(float(event["ts"]) - sent) < 5  # type: ignore[arg-type]


def test_sigterm_chains_the_handler_installed_before(tmp_path: Path, local_hub: HubServer) -> None:
    proc = _spawn(tmp_path, local_hub, "lw-chain", "chained")
    _ready(proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7 and "previous handler ran" in out
    assert _failure(local_hub, "lw-chain")["data"]["signal"] == "SIGTERM"


def test_with_form_reports_the_exception_once(tmp_path: Path, local_hub: HubServer) -> None:
    proc = _spawn(tmp_path, local_hub, "lw-with", "with", rank=0)
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    event = _failure(local_hub, "lw-with")
    assert event["data"]["reason"] == "ValueError: bad batch" and event["labels"]["rank"] == "0"
    time.sleep(0.5)
    assert len(events(local_hub.url, "lw-with", "job_failed")) == 1
