"""A throwaway VictoriaMetrics or Prometheus on a loopback port with a temporary data directory.

For the integration tests and benchmarks (both start the Debian packages' binaries this way), and
for trying the remote backend on one machine. :meth:`LocalTSDB.stop` ends the process and removes
its data.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

#: VictoriaMetrics hides points newer than ``-search.latencyOffset`` (30 s by default) from range
#: queries; a hub that reads back what it has just written wants them at once. It also keeps every
#: copy of a sample written twice (a batch retried after its meta commit failed) unless
#: deduplication is on: 1 ms keeps one sample per series and millisecond, so nothing else merges.
VM_FLAGS = (
    "-retentionPeriod=100y",
    "-search.disableCache",
    "-search.latencyOffset=0s",
    "-dedup.minScrapeInterval=1ms",
)


#: the lowest port handed out; below it live well-known services' and other tools' fixed ports
PORTS_FROM = 20_000
_chooser = random.Random()


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's range for outgoing connections' source ports."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(limit: int | None = None) -> int:
    """A loopback port free now, for a process told to listen on it.

    A port the kernel chooses (bind to 0) comes from the range it also gives outgoing connections
    as source ports: between this check and the listener's bind, any client socket may take it
    (CI saw a hub refuse its port, "in use"). So the port is drawn below that range, at random so
    that parallel processes (test workers) rarely draw the same, and checked free.
    """
    top = ephemeral_low() if limit is None else limit
    for _ in range(200):
        port = _chooser.randrange(PORTS_FROM, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {PORTS_FROM} and {top}")


def wait_http(url: str, timeout: float = 30, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``url`` answers below 500 (or ``proc`` exits, or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


@dataclass
class LocalTSDB:
    kind: str
    url: str  # base of the PromQL HTTP API
    write_url: str  # remote-write endpoint
    data: Path
    proc: subprocess.Popen[bytes]

    def flush(self) -> None:
        """Make everything written searchable now (VictoriaMetrics buffers for about a second)."""
        if self.kind == "victoriametrics":
            httpx.get(f"{self.url}/internal/force_flush", timeout=10).raise_for_status()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)


def _start(kind: str, args: list[str], port: int, data: Path, write_path: str, health: str) -> LocalTSDB:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    db = LocalTSDB(kind, url, url + write_path, data, proc)
    try:
        wait_http(url + health, proc=proc)
    except BaseException:
        db.stop()
        raise
    return db


def start_victoria_metrics(binary: str, flags: tuple[str, ...] = VM_FLAGS) -> LocalTSDB:
    """VictoriaMetrics single node: remote-write at ``/api/v1/write``, PromQL at ``/api/v1/...``."""
    data = Path(tempfile.mkdtemp(prefix="gpuscope-vm-"))
    port = free_port()
    args = [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *flags]
    return _start("victoriametrics", args, port, data, "/api/v1/write", "/health")


def start_prometheus(binary: str) -> LocalTSDB:
    """Prometheus with its remote-write receiver and no scrape targets."""
    data = Path(tempfile.mkdtemp(prefix="gpuscope-prom-"))
    config = data / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    args = [
        binary,
        "--web.enable-remote-write-receiver",
        f"--storage.tsdb.path={data / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--config.file={config}",
    ]
    return _start("prometheus", args, port, data, "/api/v1/write", "/-/ready")
