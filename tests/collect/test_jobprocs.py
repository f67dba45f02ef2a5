"""A training rank's process ending, as the node's agent sees it: real child processes, killed.

Under the kernel's process-event connector (root, as CI and the agent run) a SIGKILLed rank is
reported with its signal and the time it died; the /proc fallback reports that it is gone.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpuscope.collect.jobprocs import JobProcessCollector
from gpuscope.collect.procexit import (
    PROC_EVENT_EXIT,
    ExitWatcher,
    ProcConnector,
    ProcPoll,
    open_exit_watcher,
    parse_exits,
)
from gpuscope.hub import Hub
from gpuscope.model import Batch, Event
from gpuscope.store.duckdb import DuckDBStore

Rank = subprocess.Popen[str]
SLEEPER = "import os, sys, time; os.fork() == 0 and time.sleep(60); print('up', flush=True); time.sleep(60)"


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[str]]:
    """A rank process of job ``jp-<pid>`` (its environment says so, as torchrun's does) that has
    forked a worker of its own (which inherits the rank's environment and must not be watched)."""
    env = {**os.environ, "GPUSCOPE_JOB": f"jp-{os.getpid()}", "RANK": "2"}
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    workers = _children(proc.pid)
    assert len(workers) == 1
    yield proc
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(c) for c in fh.read().split()]
    except OSError:
        return []


def _mine(events: list[Event]) -> list[Event]:
    return [e for e in events if e.labels.get("job") == f"jp-{os.getpid()}"]


def _kill_and_collect(
    collector: JobProcessCollector, proc: subprocess.Popen[str]
) -> tuple[float, list[Event]]:
    assert _mine(collector.collect(time.time()).events) == []  # alive: watched, nothing to say
    assert proc.pid in collector._watched and not set(_children(proc.pid)) & collector._watched.keys()
    killed_at = time.time()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    found: list[Event] = []
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        found = _mine(collector.collect(time.time()).events)
        time.sleep(0.05)
    return killed_at, found


def _connector() -> ExitWatcher:
    if os.geteuid() != 0:
        pytest.skip("the process-event connector needs root (CAP_NET_ADMIN); CI runs as root")
    try:
        return ProcConnector()
    except OSError as exc:
        pytest.skip(f"the process-event connector cannot be opened here: {exc}")


def test_connector_names_a_sigkilled_rank_with_its_signal_and_time(rank: subprocess.Popen[str]) -> None:
    collector = JobProcessCollector("node-1", watcher=_connector())
    try:
        killed_at, found = _kill_and_collect(collector, rank)
    finally:
        collector.close()
    [event] = found
    assert event.kind == "process_exited"
    assert event.labels == {"job": f"jp-{os.getpid()}", "rank": "2", "node": "node-1"}
    assert event.data["signal"] == "SIGKILL" and "exit_code" not in event.data
    assert event.data["pid"] == rank.pid and event.data["source"] == "connector"
    assert event.data["reason"] == "killed by SIGKILL"
    assert killed_at - 0.5 <= event.ts <= killed_at + 1.0  # the kernel's time of the exit


def test_proc_fallback_reports_the_rank_gone_without_a_code(rank: subprocess.Popen[str]) -> None:
    collector = JobProcessCollector("node-1", watcher=ProcPoll())
    killed_at, found = _kill_and_collect(collector, rank)
    [event] = found
    assert event.labels == {"job": f"jp-{os.getpid()}", "rank": "2", "node": "node-1"}
    assert "signal" not in event.data and "exit_code" not in event.data
    assert (
        event.data["source"] == "proc" and event.data["reason"] == "its process is gone (exit status unknown)"
    )
    assert event.ts >= killed_at
    assert _mine(collector.collect(time.time()).events) == []  # reported once


def test_a_zombie_counts_as_gone_for_the_fallback() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not ProcPoll().exits([proc.pid], 0.0):
        time.sleep(0.02)  # exited, not yet reaped: a zombie
    assert [e.pid for e in ProcPoll().exits([proc.pid], 0.0)] == [proc.pid]
    proc.wait(10)


def test_open_exit_watcher_falls_back_off_the_host_proc(tmp_path: object) -> None:
    assert isinstance(open_exit_watcher(str(tmp_path)), ProcPoll)


def test_parse_exits_decodes_status_and_skips_threads() -> None:
    def message(pid: int, tgid: int, status: int, ts_ns: int) -> bytes:
        event = struct.pack("=IIQ", PROC_EVENT_EXIT, 0, ts_ns) + struct.pack(
            "=iiIIii", pid, tgid, status, 17, 1, 1
        )
        cn = struct.pack("=IIIIHH", 1, 1, 0, 0, len(event), 0) + event
        return struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, 0) + cn

    second = 1_000_000_000
    data = (
        message(10, 10, 9, 4 * second) + message(11, 10, 0, 4 * second) + message(12, 12, 3 << 8, 5 * second)
    )
    exits = parse_exits(data, now_wall=1000.0, now_mono_ns=6 * second)
    assert [(e.pid, e.exit_code, e.signal, e.ts) for e in exits] == [
        (10, None, "SIGKILL", 998.0),  # killed: the wait status's low bits
        (12, 3, None, 999.0),  # exit(3): its high byte; pid 11 was a thread of 10
    ]


def test_through_a_hub_the_killed_rank_is_named_first(rank: Rank) -> None:
    """The agent's event beside the SDK's: ranks 0 and 1 say they were SIGTERMed (torchrun's
    teardown), rank 2 (the real process here) was SIGKILLed and said nothing."""
    job = f"jp-{os.getpid()}"
    watcher = open_exit_watcher()
    collector = JobProcessCollector("node-1", watcher=watcher)
    t0 = time.time()
    sdk = [Event(t0 - 10, "job_started", {"job": job}, {"kind": "training", "world_size": 3})]
    for ts in range(10):
        for r in range(3):
            labels = {"job": job, "rank": str(r), "node": "node-1", "gpu": str(r)}
            sdk.append(Event(t0 - 10 + ts + 0.5, "heartbeat", labels, {"step": ts}))
    try:
        killed_at, agent = _kill_and_collect(collector, rank)
    finally:
        collector.close()
    for r in (0, 1):
        labels = {"job": job, "rank": str(r), "node": "node-1", "gpu": str(r)}
        words = {"cause": "signal", "signal": "SIGTERM", "reason": "terminated by SIGTERM"}
        sdk.append(Event(killed_at + 0.3 + r * 0.1, "job_failed", labels, words))
    hub = Hub(DuckDBStore(":memory:", durable=False))
    try:
        hub.ingest(Batch("sdk", events=sdk))
        hub.ingest(Batch("agent:node-1", events=agent))
        hub.evaluate(killed_at + 1)
        hub.evaluate(killed_at + 5)
        [alert] = [a for a in hub.firing() if a.rule == "job_failed" and a.entity == {"job": job}]
    finally:
        hub.store.close()
    assert alert.details["first_rank"] == 2, alert.summary
    if watcher.source == "connector":
        assert alert.details["signal"] == "SIGKILL" and alert.details["cause"] == "killed"
        assert f"rank 2 (node-1 GPU 2) died first: killed by SIGKILL (pid {rank.pid}" in alert.summary
    else:  # without a status, its silence before the others' words names it
        assert alert.details["cause"] == "silent"
