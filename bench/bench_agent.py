"""Agent overhead: CPU time per collection round, 8 GPUs (fake NVML) plus host, InfiniBand, kernel log.

Budget (DESIGN §6): at most 0.5 % of one core at 1 Hz, i.e. 5 ms of CPU per round. The NVML
collector runs the real code over the fake NVML, so this measures gpuscope's own cost (the
driver's own time per call is not included). Anchor, same run: prometheus-node-exporter (the
Debian package) CPU per scrape of a node's host metrics, if installed.

    .venv/bin/python bench/bench_agent.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, console, free_port, print_table, wait_http
from gpuscope.collect.base import CollectorSet
from gpuscope.collect.fake_nvml import FakeNvml, FakeProcess
from gpuscope.collect.host import HostCollector
from gpuscope.collect.infiniband import InfinibandCollector
from gpuscope.collect.kmsg import KernelLogCollector
from gpuscope.collect.nvml import NvmlCollector

FIXTURES = ROOT / "tests" / "collect" / "fixtures"
ROUNDS = 300
BUDGET_PCT = 0.5


def busy_fleet() -> FakeNvml:
    fake = FakeNvml.healthy(8)
    for i, g in enumerate(fake.gpus):
        g.util_gpu, g.used, g.temp, g.power_mw, g.sm_clock, g.reasons = 98, 70 * 2**30, 64, 610_000, 1980, 0
        g.processes = [FakeProcess(os.getpid(), 60 * 2**30)]
        for link in g.links:
            link.tx_kib = link.rx_kib = i
    return fake


def cpu_per_round(cs: CollectorSet, rounds: int) -> float:
    cs.collect(time.time())  # discovery and first readings happen once
    start = time.process_time()
    for k in range(rounds):
        cs.collect(time.time() + k)
    return (time.process_time() - start) / rounds


def agent_rows() -> list[list[str]]:
    rows = []
    for label, slow_every in (
        ("8 GPUs, slow counters every 5 s (default)", 5),
        ("8 GPUs, everything every round", 1),
    ):
        fake = busy_fleet()
        nvml = NvmlCollector("bench", lib=fake, slow_every=slow_every, watch_events=True)
        cs = CollectorSet(
            [
                nvml,
                HostCollector("bench"),
                InfinibandCollector("bench", sys_root=str(FIXTURES / "sys")),
                KernelLogCollector("bench", path=str(FIXTURES / "dmesg-with-xid-119.log")),
            ]
        )
        calls = fake.calls
        per = cpu_per_round(cs, ROUNDS)
        calls_per_round = (fake.calls - calls) / (ROUNDS + 1)
        cs.close()
        nvml_only = CollectorSet(
            [NvmlCollector("bench", lib=busy_fleet(), slow_every=slow_every, watch_events=False)]
        )
        per_nvml = cpu_per_round(nvml_only, ROUNDS)
        nvml_only.close()
        pct = per * 100  # CPU seconds per second at 1 Hz, in percent of one core
        rows.append(
            [
                f"gpuscope agent: {label}",
                f"{per * 1e3:.2f} ms (NVML part {per_nvml * 1e3:.2f} ms, {calls_per_round:.0f} NVML calls)",
                f"{pct:.3f} %",
                "yes" if pct <= BUDGET_PCT else "NO",
            ]
        )
    return rows


def node_exporter_row() -> list[str] | None:
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        console.print("[yellow]prometheus-node-exporter not installed: anchor skipped[/yellow]")
        return None
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics")
        ps = psutil.Process(proc.pid)
        with httpx.Client() as client:
            client.get(f"http://127.0.0.1:{port}/metrics")
            before = ps.cpu_times()
            n = 60
            for _ in range(n):
                client.get(f"http://127.0.0.1:{port}/metrics")
            after = ps.cpu_times()
        per = ((after.user + after.system) - (before.user + before.system)) / n
        return [
            "anchor: prometheus-node-exporter, one scrape (host only, no GPU)",
            f"{per * 1e3:.2f} ms",
            f"{per * 100:.3f} %",
            "-",
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    rows = agent_rows()
    anchor = node_exporter_row()
    if anchor is not None:
        rows.append(anchor)
    rows.append(["reference: dcgm-exporter default CPU request (DESIGN §6)", "-", "10 % (100m)", "-"])
    print_table(
        f"Agent CPU per 1 Hz round ({ROUNDS} rounds, {os.cpu_count()} cores; "
        f"budget {BUDGET_PCT} % of one core)",
        ["what", "CPU per round", "share of one core at 1 Hz", "within budget"],
        rows,
    )


if __name__ == "__main__":
    main()
