"""Helpers for tests that run real hub and agent processes (and other servers) on loopback ports,
skip when a Debian binary is missing, and the shared set-up of the serving detector's tests."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import ServingDetector
from gpuscope.model import Finding
from gpuscope.store.remote.local import free_port as free_port  # the one chooser of ports

#: where tests leave screenshots and other by-products: ignored by git (``.gitignore``), so a test
#: run leaves a clone as clean as it found it
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def load_script(path: Path, name: str) -> ModuleType:
    """A script outside the package (bench/, eval/) imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def need_binary(binary: str, package: str) -> str:
    """The path of ``binary``. Missing, the test is skipped, or fails in CI (``CI=true``), where
    ``scripts/system-deps.sh`` installs the Debian ``package``."""
    found = shutil.which(binary)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"{binary} is not installed: scripts/system-deps.sh installs the Debian package {package}"
            )
        pytest.skip(f"{binary} is not installed (apt-get install -y {package})")
    return found


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


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler for test servers: answers with :meth:`reply` and logs nothing."""

    def reply(self, status: int, body: bytes, content_type: str = "text/plain; version=0.0.4") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def loopback_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on a free loopback port answering with ``handler``: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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


def chat_snapshot(
    ts: float,
    rng: np.random.Generator,
    *,
    latency: float = 1.0,
    ttft: float = 1.0,
    p99: float = 0.6,
    requests: float = 30.0,
    errors: float = 0.0,
    queue: float = 2.0,
) -> Snapshot:
    """The ``chat`` service on one node: p95 latency 0.4 s times ``latency`` and time to first token
    0.1 s times ``ttft``, each with log-normal noise, then a Poisson queue of mean ``queue`` (drawn
    from ``rng`` in that order); the KV cache half full and no preemptions."""
    return Snapshot(
        ts=ts,
        requests=requests,
        errors=errors,
        p95=0.4 * latency * float(np.exp(0.04 * rng.standard_normal())),
        p99=p99,
        ttft=0.1 * ttft * float(np.exp(0.05 * rng.standard_normal())),
        queue=float(rng.poisson(queue)),
        kv=0.5,
        preempted=0.0,
        model="chat",
        version="v1",
        nodes=["node-0"],
    )


def judge_chat(
    times: Iterable[float], snapshot: Callable[[float], Snapshot]
) -> list[tuple[float, list[Finding]]]:
    """One ServingDetector judging the ``chat`` service's snapshot at each of ``times``."""
    detector = ServingDetector()
    return [(ts, detector.judge(ts, {"chat": snapshot(ts)})) for ts in times]


def onsets(results: Iterable[tuple[float, list[Finding]]]) -> list[tuple[float, str]]:
    """(time, rule) of each finding's start: a rule found at a tick and not at the one before."""
    out: list[tuple[float, str]] = []
    was: set[str] = set()
    for ts, findings in results:
        now = {f.rule for f in findings}
        out += [(ts, rule) for rule in sorted(now - was)]
        was = now
    return out


def onsets_of(results: Iterable[tuple[float, list[Finding]]], rule: str) -> list[float]:
    return [ts for ts, found in onsets(results) if found == rule]
