"""The slurm collector against a real single-node Slurm: Debian's slurmctld, slurmd and munge,
started here as root on loopback, with real jobs that run, fail and wait in the queue."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscope.collect.slurm import SlurmCollector
from gpuscope.model import Frame
from support import free_port

pytestmark = pytest.mark.integration  # munged, slurmctld and slurmd

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.pids: list[Path] = []

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def runner(self) -> Callable[[list[str]], str]:
        return lambda argv: self.run(*argv)

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir()
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (r / "munge").chmod(0o700)
        sock = r / "munge" / "munge.socket"
        (r / "slurm.conf").write_text(
            "\n".join(
                [
                    "ClusterName=gpuscope-test",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "JobCompType=jobcomp/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "MinJobAge=600",
                    "GresTypes=gpu",
                    "NodeName=n1 NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN",
                    "PartitionName=gpu Nodes=n1 Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        # two stand-in device files make two countable GPUs (gres.conf File= needs a device path)
        (r / "gres.conf").write_text("NodeName=n1 Name=gpu File=/dev/null,/dev/zero\n")
        munge = ["munged", "--force", f"--socket={sock}", f"--key-file={key}"]
        munge += [f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}"]
        munge += [f"--seed-file={r / 'munge' / 'seed'}"]
        self.run(*munge)
        self.pids.append(r / "munge" / "munged.pid")
        self.run("slurmctld", "-c")
        self.pids.append(r / "slurmctld.pid")
        self.run("slurmd", "-N", "n1")
        self.pids.append(r / "slurmd.pid")
        self.wait(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T"), "node n1 to register")

    def wait(self, ok: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except RuntimeError:
                pass
            time.sleep(0.3)
        log = (self.root / "log" / "slurmctld.log").read_text()[-2000:]
        raise AssertionError(f"waited {timeout:.0f} s for {what}; slurmctld log:\n{log}")

    def stop(self) -> None:
        if len(self.pids) == 3:  # every daemon up: let slurmd end the jobs' steps before it goes
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.run("scancel", "--full", "--signal=KILL", "--partition=gpu")
                self.wait(lambda: not self.run("squeue", "-h", "-o", "%i"), "the jobs to end", timeout=15)
        for pid_file in reversed(self.pids):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld, slurmd and munged needs root")
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is not installed ({', '.join(missing)}): scripts/system-deps.sh installs it")
        pytest.skip(f"Debian packages slurmctld, slurmd, slurm-client and munge are not installed: {missing}")
    cluster = Cluster(tmp_path / "slurm")
    cluster.root.mkdir()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _rows(frames: list[Frame], key: str) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for f in frames:
        for i, labels in enumerate(f.entities):
            if key in labels and (key != "partition" or "job_id" not in labels):
                values = {
                    m: float(f.values[i, j])
                    for j, m in enumerate(f.metrics)
                    if f.values[i, j] == f.values[i, j]
                }
                out[labels[key]] = {**values, **labels}
    return out


def test_real_jobs_that_run_fail_and_wait(slurm: Cluster) -> None:
    def submit(*args: str) -> str:
        return slurm.run("sbatch", "--parsable", "-o", "/dev/null", *args).strip()

    running = submit("-J", "train", "--gres=gpu:1", "-c", "1", "--wrap", "sleep 120")
    failing = submit("-J", "crash", "-c", "1", "--wrap", "exit 3")
    slurm.wait(lambda: "RUNNING" in slurm.run("squeue", "-h", "-j", running, "-o", "%T"), "the job to run")
    waiting = submit("-J", "big", "--gres=gpu:2", "-c", "1", "--wrap", "sleep 1")
    slurm.wait(
        lambda: "FAILED" in slurm.run("squeue", "-h", "-t", "all", "-j", failing, "-o", "%T"),
        "the job to fail",
    )

    slurm.wait(
        lambda: "Resources" in slurm.run("squeue", "-h", "-j", waiting, "-o", "%r"),
        "the scheduler to judge it",
    )
    collector = SlurmCollector("login-1", run=slurm.runner())
    got = collector.collect(time.time())
    assert got.errors == []
    (failed,) = [e for e in got.events if e.kind == "job_failed"]
    assert failed.labels == {"job": failing}
    assert failed.data["exit_code"] == 3 and failed.data["reason"] == "NonZeroExitCode"
    jobs = _rows(got.frames, "job_id")
    assert jobs[waiting]["reason"] == "Resources" and jobs[waiting]["slurm_job_gpus"] == 2
    assert "slurm_job_queue_wait_seconds" in jobs[running]
    part = _rows(got.frames, "partition")["gpu"]
    assert (
        part["slurm_gpus_running"] == 1 and part["slurm_gpus_pending"] == 2 and part["slurm_gpus_total"] == 2
    )
    assert _rows(got.frames, "node")["n1"]["slurm_node_unavailable"] == 0

    slurm.run("scontrol", "update", "nodename=n1", "state=drain", "reason=fan replaced")
    got = collector.collect(time.time())
    assert _rows(got.frames, "node")["n1"]["slurm_node_unavailable"] == 1
    assert _rows(got.frames, "partition")["gpu"]["slurm_gpus_unavailable"] == 2
    assert [e for e in got.events if e.kind == "job_failed"] == []  # reported once
    slurm.run("scancel", running, waiting)
