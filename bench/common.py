"""Shared pieces of the benchmarks: realistic GPU telemetry, servers on loopback, result tables."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from gpuscope.config import load_config
from gpuscope.loadgen import FleetShape
from gpuscope.loadgen.traffic import build_scenario
from gpuscope.sim.cluster import Simulator
from gpuscope.store.remote.local import free_port, start_victoria_metrics

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
console = Console(stderr=True)

#: 30 GPU metrics an agent reports every second, with (level, noise, resolution) of real H100s.
TELEMETRY: dict[str, tuple[float, float, float]] = {
    "gpu_utilization_percent": (92, 8, 1),
    "gpu_sm_active_ratio": (0.62, 0.08, 0.001),
    "gpu_sm_occupancy_ratio": (0.35, 0.05, 0.001),
    "gpu_tensor_active_ratio": (0.41, 0.07, 0.001),
    "gpu_dram_active_ratio": (0.33, 0.05, 0.001),
    "gpu_memory_utilization_percent": (38, 6, 1),
    "gpu_memory_used_bytes": (71e9, 0, 2**20),
    "gpu_memory_free_bytes": (9e9, 0, 2**20),
    "gpu_memory_total_bytes": (80e9, 0, 2**20),
    "gpu_temp_celsius": (67, 2, 1),
    "gpu_memory_temp_celsius": (72, 2, 1),
    "gpu_power_watts": (610, 45, 0.001),
    "gpu_power_limit_watts": (700, 0, 1),
    "gpu_sm_clock_mhz": (1980, 0, 15),
    "gpu_memory_clock_mhz": (2619, 0, 1),
    "gpu_clock_event_reasons": (0, 0, 1),
    "gpu_throttle_sw_power": (0, 0, 1),
    "gpu_throttle_hw_slowdown": (0, 0, 1),
    "gpu_throttle_sw_thermal": (0, 0, 1),
    "gpu_throttle_hw_thermal": (0, 0, 1),
    "gpu_ecc_sbe_volatile_total": (0, 0, 1),
    "gpu_ecc_dbe_volatile_total": (0, 0, 1),
    "gpu_remapped_rows_correctable": (0, 0, 1),
    "gpu_remapped_rows_uncorrectable": (0, 0, 1),
    "gpu_pcie_tx_bytes_per_second": (3.1e9, 4e8, 1024),
    "gpu_pcie_rx_bytes_per_second": (2.9e9, 4e8, 1024),
    "gpu_pcie_replay_total": (0, 0, 1),
    "gpu_nvlink_tx_bytes_per_second": (1.4e11, 2e10, 1024),
    "gpu_nvlink_rx_bytes_per_second": (1.4e11, 2e10, 1024),
    "gpu_energy_joules_total": (0, 0, 1),
}


@dataclass
class Fleet:
    nodes: int
    gpus_per_node: int

    @property
    def entities(self) -> list[dict[str, str]]:
        return [
            {"node": f"node-{n}", "gpu": str(g), "job": f"job-{n // 16}"}
            for n in range(self.nodes)
            for g in range(self.gpus_per_node)
        ]


def telemetry_ticks(
    fleet: Fleet, ticks: int, seed: int = 1, t0: float | None = None
) -> Iterator[tuple[float, list[str], np.ndarray]]:
    """Per tick: timestamp, metric names, values[entity, metric] with realistic noise and resolution."""
    rng = np.random.default_rng(seed)
    names = list(TELEMETRY)
    level = np.array([TELEMETRY[m][0] for m in names])
    noise = np.array([TELEMETRY[m][1] for m in names])
    step = np.array([TELEMETRY[m][2] for m in names])
    n = fleet.nodes * fleet.gpus_per_node
    energy = names.index("gpu_energy_joules_total")
    power = names.index("gpu_power_watts")
    base = level + rng.normal(0, 1, (n, len(names))) * noise * 0.5  # per-GPU offsets
    state = base.copy()
    start = time.time() - ticks if t0 is None else t0
    for k in range(ticks):
        state = 0.8 * state + 0.2 * (base + rng.normal(0, 1, state.shape) * noise)
        values = np.round(state / step) * step
        values[:, energy] = 0 if k == 0 else values[:, energy]
        state[:, energy] += state[:, power]
        values[:, energy] = np.round(state[:, energy])
        yield start + k, names, np.clip(values, 0, None)


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def victoria_metrics_binary() -> str | None:
    """The Debian package's binary; installed on demand when running as root, else None."""
    found = shutil.which("victoria-metrics")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "victoria-metrics"], capture_output=True, check=False
        )
    return shutil.which("victoria-metrics")


@contextmanager
def victoria_metrics() -> Iterator[tuple[str, Path] | None]:
    """A VictoriaMetrics single node on a loopback port with a temporary data dir, or None."""
    binary = victoria_metrics_binary()
    if binary is None:
        console.print("[yellow]victoria-metrics not installed: anchor skipped[/yellow]")
        yield None
        return
    db = start_victoria_metrics(binary)
    try:
        yield db.url, db.data
    finally:
        db.stop()


def prometheus_bodies(shape: FleetShape, ticks: int) -> list[list[bytes]]:
    """Per tick, Prometheus-text bodies of 16 nodes each (no timestamps: VictoriaMetrics stamps them)."""
    sim = Simulator(build_scenario(shape, ticks, faults=[]))
    out = []
    for tick in sim.ticks():
        bodies = []
        for batch in tick.node_batches.values():
            lines = []
            for frame in batch.frames:
                for labels, row in zip(frame.entities, frame.values.tolist(), strict=True):
                    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
                    lines += [
                        f"{m}{{{sel}}} {v:.6g}" for m, v in zip(frame.metrics, row, strict=True) if v == v
                    ]
            bodies.append(("\n".join(lines) + "\n").encode())
        # 16 nodes a request: this one client process could not post 1,024 requests a second,
        # and VictoriaMetrics' cost per sample hardly depends on the request size
        out.append([b"".join(bodies[k : k + 16]) for k in range(0, len(bodies), 16)])
    return out


class Pacer(threading.Thread):
    """Posts the bodies of tick ``k % len(ticks)`` to ``url`` at second ``k`` of ``seconds``, each
    tick's requests at once (an anchor TSDB fed at the fleet's pace); ``latencies`` (s) and
    ``errors`` when done. ``run()`` paces in the calling thread, ``start()`` beside it."""

    def __init__(self, url: str, ticks: list[list[bytes]], seconds: float) -> None:
        super().__init__(daemon=True, name="pacer")
        self.url, self.ticks, self.seconds = url, ticks, seconds
        self.latencies: list[float] = []
        self.errors = 0

    def run(self) -> None:
        asyncio.run(self._pace())

    async def _pace(self) -> None:
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:

            async def post(body: bytes) -> None:
                started = time.perf_counter()
                try:
                    resp = await client.post(self.url, content=body)
                    self.errors += resp.status_code >= 300
                except httpx.HTTPError:
                    self.errors += 1
                self.latencies.append(time.perf_counter() - started)

            t0 = time.time()
            pending: set[asyncio.Task[None]] = set()
            for k in range(int(self.seconds)):
                await asyncio.sleep(max(0.0, t0 + k - time.time()))
                pending |= {asyncio.create_task(post(b)) for b in self.ticks[k % len(self.ticks)]}
                pending = {t for t in pending if not t.done()}
            if pending:
                await asyncio.wait(pending)


@contextmanager
def gpuscope_hub(
    db: Path, extra: list[str] | None = None, ready_s: float = 30, entry: list[str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real hub process (``gpuscope hub``) on a loopback port, answering within ``ready_s``;
    ``entry``: what runs the command line instead of ``-m gpuscope.cli`` (a profiling wrapper)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            *(entry or ["-m", "gpuscope.cli"]),
            "hub",
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            str(db),
            *(extra or []),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/health", ready_s)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def hub_flush_interval_s() -> float:
    """How often the hub :func:`gpuscope_hub` starts commits (``storage.flush_interval_s``): it is
    given no ``--config``, so it reads ``$GPUSCOPE_CONFIG`` or the defaults, as this does."""
    return load_config().storage_settings().flush_interval_s


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*r)
    Console(width=max(160, Console().width)).print(table)


def per_call_us(fn: Callable[[int], None], calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean cost of one call, in microseconds."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(calls)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)
