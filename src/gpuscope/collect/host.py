"""Host telemetry of one node: CPU, load, memory, root disk, network throughput, TCP segments.

On Linux everything but the disk is read from procfs under ``proc_root`` (like node_exporter's
``--path.procfs``), so the agent can watch a host from a container and tests can read fixture
trees. Elsewhere psutil stands in for procfs. Throughput and CPU percent are rates between two
rounds, so the first round has none; TCP segments are sent as raw counters, the detectors take
their rates (retransmit ratio). A part that fails is listed as an error; the others are reported.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import psutil

from gpuscope.collect.base import Collected, Collector, CollectorError, register_collector
from gpuscope.collect.procfs import (
    CpuTimes,
    ProcFormatError,
    parse_loadavg,
    parse_meminfo,
    parse_net_dev,
    parse_snmp,
    parse_stat_cpu,
    tcp_segments,
)
from gpuscope.model import Frame
from gpuscope.signals import NODE_METRICS

T = TypeVar("T")

#: Interfaces left out of throughput: loopback traffic never leaves the node.
LOOPBACK = frozenset({"lo", "lo0"})


@dataclass(slots=True)
class HostReading:
    """Raw counters and gauges of one round; None where that part could not be read."""

    cpu: CpuTimes | None = None
    load1: float | None = None
    memory: tuple[float, float] | None = None  # used, total bytes
    disk_used_ratio: float | None = None
    net: dict[str, tuple[int, int]] | None = None  # iface -> rx, tx bytes
    tcp: tuple[int, int] | None = None  # out segs, retrans segs
    errors: list[CollectorError] = field(default_factory=list)

    def attempt(self, kind: str, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except (OSError, ProcFormatError) as exc:
            self.errors.append(CollectorError(kind, str(exc)))
            return None


@register_collector
class HostCollector(Collector):
    """Per-node host metrics (``signals.NODE_METRICS`` names), entity ``{"node": <node>}``."""

    name = "host"
    default = True

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        disk_path: str = "/",
        use_psutil: bool | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.disk_path = disk_path
        if use_psutil is None:
            use_psutil = not sys.platform.startswith("linux") and proc_root == "/proc"
        self.use_psutil = use_psutil
        self._prev: tuple[float, HostReading] | None = None

    def _read_text(self, rel: str) -> str:
        with open(os.path.join(self.proc_root, rel), encoding="ascii", errors="replace") as fh:
            return fh.read()

    def _tcp(self) -> tuple[int, int]:
        path = f"{self.proc_root}/net/snmp"
        return tcp_segments(parse_snmp(self._read_text("net/snmp"), path), path)

    def read(self) -> HostReading:
        """One set of raw readings from procfs (or psutil) and the disk."""
        r = HostReading()
        if self.use_psutil:
            r.cpu = r.attempt("cpu", _psutil_cpu)
            r.load1 = r.attempt("loadavg", lambda: float(psutil.getloadavg()[0]))
            r.memory = r.attempt("meminfo", _psutil_memory)
            r.net = r.attempt("net_dev", _psutil_net)
        else:
            p = self.proc_root
            r.cpu = r.attempt("stat", lambda: parse_stat_cpu(self._read_text("stat"), f"{p}/stat"))
            r.load1 = r.attempt("loadavg", lambda: parse_loadavg(self._read_text("loadavg"), f"{p}/loadavg"))
            r.memory = r.attempt("meminfo", lambda: parse_meminfo(self._read_text("meminfo"), f"{p}/meminfo"))
            r.net = r.attempt("net_dev", lambda: parse_net_dev(self._read_text("net/dev"), f"{p}/net/dev"))
            r.tcp = r.attempt("snmp", self._tcp)
        r.disk_used_ratio = r.attempt("disk", lambda: _disk_used_ratio(self.disk_path))
        return r

    def collect(self, now: float) -> Collected:
        reading = self.read()
        values: dict[str, float] = {}
        if reading.load1 is not None:
            values["node_load1"] = reading.load1
        if reading.memory is not None:
            values["node_memory_used_bytes"], values["node_memory_total_bytes"] = reading.memory
        if reading.disk_used_ratio is not None:
            values["node_disk_used_ratio"] = reading.disk_used_ratio
        if reading.tcp is not None:
            values["node_tcp_out_segs_total"] = float(reading.tcp[0])
            values["node_tcp_retrans_segs_total"] = float(reading.tcp[1])
        if self._prev is not None:
            values.update(_rates(*self._prev, now, reading))
        self._prev = (now, reading)
        out = Collected(errors=reading.errors)
        metrics = [m for m in NODE_METRICS if m in values and math.isfinite(values[m])]
        if metrics:
            row = np.array([[values[m] for m in metrics]], dtype=np.float64)
            out.frames.append(Frame(ts=now, metrics=metrics, entities=[{"node": self.node}], values=row))
        return out


def _rates(prev_ts: float, prev: HostReading, now: float, cur: HostReading) -> dict[str, float]:
    """CPU percent and network throughput between two readings; counter resets give no rate."""
    out: dict[str, float] = {}
    if prev.cpu is not None and cur.cpu is not None:
        d_total = cur.cpu.total - prev.cpu.total
        # busy is a difference of float sums (and iowait may step back), so an idle interval can
        # show a hair below zero: clamp rather than lose the reading.
        d_busy = max(0.0, cur.cpu.busy - prev.cpu.busy)
        if d_total > 0:
            out["node_cpu_percent"] = min(100.0, 100.0 * d_busy / d_total)
    dt = now - prev_ts
    if prev.net is not None and cur.net is not None and dt > 0:
        rx = tx = 0
        common = 0
        for iface, (c_rx, c_tx) in cur.net.items():
            p = prev.net.get(iface)
            if iface in LOOPBACK or p is None or c_rx < p[0] or c_tx < p[1]:
                continue  # new interface or counter reset: no rate for it this round
            rx, tx, common = rx + c_rx - p[0], tx + c_tx - p[1], common + 1
        if common:
            out["node_net_rx_bytes_per_second"] = rx / dt
            out["node_net_tx_bytes_per_second"] = tx / dt
    return out


def _disk_used_ratio(path: str) -> float:
    usage = psutil.disk_usage(path)
    size = usage.used + usage.free  # as df: space reserved for root does not count as free
    if size <= 0:
        raise ProcFormatError(path, "filesystem reports no space at all")
    return usage.used / size


def _psutil_cpu() -> CpuTimes:
    t = psutil.cpu_times()._asdict()
    # guest time is already counted in user time (as in /proc/stat)
    total = float(sum(v for k, v in t.items() if k not in ("guest", "guest_nice")))
    idle = t["idle"] + t.get("iowait", 0.0)
    return CpuTimes(busy=total - idle, total=total)


def _psutil_memory() -> tuple[float, float]:
    vm = psutil.virtual_memory()
    return float(vm.total - vm.available), float(vm.total)


def _psutil_net() -> dict[str, tuple[int, int]]:
    return {k: (v.bytes_recv, v.bytes_sent) for k, v in psutil.net_io_counters(pernic=True).items()}
