"""Helpers for tests that run real hub and agent processes on loopback ports."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Process:
    """A gpuscope command run as a real child process, its output kept in a file for failures."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log = log
        self._file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscope.cli", *args],
            stdout=self._file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def output(self) -> str:
        self._file.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self.kill(signal.SIGTERM)
        self._file.close()


class HubProcess(Process):
    def __init__(
        self,
        tmp: Path,
        port: int,
        db: Path,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            ["hub", "--listen", f"127.0.0.1:{port}", "--db", str(db), *(extra or [])],
            tmp / f"hub-{port}.log",
            env,
        )
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 45) -> None:
        # a hub no longer imports every subcommand's module to build its parser (gpuscope.cli); it
        # answered within 13 s on two cores at load average 22 (bench/bench_cli_start.py)
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"hub exited:\n{self.output()}")
            return httpx.get(f"{self.url}/api/v1/health", timeout=1).status_code == 200

        wait_until(ready, timeout, "the hub to answer")


@contextlib.contextmanager
def freed_arena_memory() -> Iterator[None]:
    """80 MiB of small blocks (below glibc's mmap threshold: they live in an arena), written so they
    are resident, then freed behind a block that keeps the heap's top: glibc keeps the pages until
    something trims them. The fence is freed on exit."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(20_000)]
    for block in blocks:
        ctypes.memset(block, 1, 4096)
    fence = libc.malloc(64)
    for block in blocks:
        libc.free(block)
    try:
        yield
    finally:
        libc.free(fence)
