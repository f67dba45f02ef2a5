"""Parsers for the procfs files the host collector reads, on text so tests feed them anything.

Each parser raises :class:`ProcFormatError` naming the file, the line and what was expected,
so a broken or unexpected file is reported precisely instead of yielding wrong numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ProcFormatError(ValueError):
    """A procfs file did not have the expected format."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def _int(token: str, path: str, where: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise ProcFormatError(path, f"{where}: {token!r} is not an integer") from None


def parse_snmp(text: str, path: str = "net/snmp") -> dict[str, dict[str, int]]:
    """``/proc/net/snmp``: per protocol a header line of field names, then a line of values.

    Returns ``{"Tcp": {"OutSegs": 594855, ...}, ...}``. Values may be negative (``MaxConn -1``).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    out: dict[str, dict[str, int]] = {}
    i = 0
    while i < len(lines):
        head_no = i + 1
        proto, sep, names_part = lines[i].partition(":")
        if not sep or not proto or " " in proto:
            raise ProcFormatError(path, f"line {head_no}: expected '<Protocol>: <field names>'")
        if i + 1 >= len(lines):
            raise ProcFormatError(path, f"line {head_no}: header of {proto} has no value line after it")
        vproto, vsep, values_part = lines[i + 1].partition(":")
        if not vsep or vproto != proto:
            raise ProcFormatError(
                path, f"line {head_no + 1}: expected the values of {proto}, found {lines[i + 1][:40]!r}"
            )
        names, values = names_part.split(), values_part.split()
        if len(names) != len(values):
            raise ProcFormatError(
                path, f"line {head_no + 1}: {proto} has {len(names)} field names but {len(values)} values"
            )
        if proto in out:
            raise ProcFormatError(path, f"line {head_no}: protocol {proto} appears twice")
        out[proto] = {
            name: _int(v, path, f"line {head_no + 1} {proto}.{name}")
            for name, v in zip(names, values, strict=True)
        }
        i += 2
    return out


def tcp_segments(snmp: dict[str, dict[str, int]], path: str = "net/snmp") -> tuple[int, int]:
    """``(OutSegs, RetransSegs)`` from parsed ``/proc/net/snmp``."""
    tcp = snmp.get("Tcp")
    if tcp is None:
        raise ProcFormatError(path, "has no Tcp lines")
    missing = [k for k in ("OutSegs", "RetransSegs") if k not in tcp]
    if missing:
        raise ProcFormatError(path, f"Tcp lines lack {', '.join(missing)}")
    return tcp["OutSegs"], tcp["RetransSegs"]


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative CPU time over all cores; busy = total - idle - iowait."""

    busy: float
    total: float


def parse_stat_cpu(text: str, path: str = "stat") -> CpuTimes:
    """The aggregate ``cpu`` line of ``/proc/stat`` (in USER_HZ ticks)."""
    for no, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if fields and fields[0] == "cpu":
            if len(fields) < 5:
                raise ProcFormatError(
                    path, f"line {no}: cpu line has {len(fields) - 1} fields, need at least 4"
                )
            ticks = [_int(v, path, f"line {no} cpu field {j}") for j, v in enumerate(fields[1:], 1)]
            # user nice system idle iowait irq softirq steal; guest time is already inside user
            total = sum(ticks[:8])
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            return CpuTimes(busy=float(total - idle), total=float(total))
    raise ProcFormatError(path, "has no aggregate 'cpu' line")


def parse_loadavg(text: str, path: str = "loadavg") -> float:
    """The one-minute load average from ``/proc/loadavg``."""
    fields = text.split()
    if not fields:
        raise ProcFormatError(path, "is empty")
    try:
        load = float(fields[0])
    except ValueError:
        load = math.nan
    if not 0 <= load < math.inf:
        raise ProcFormatError(path, f"{fields[0]!r} is not a load average")
    return load


def parse_meminfo(text: str, path: str = "meminfo") -> tuple[float, float]:
    """``(used_bytes, total_bytes)`` from ``/proc/meminfo``; used = total - available.

    Kernels before 3.14 have no MemAvailable; free + buffers + cached stands in for it there.
    """
    kib: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), 1):
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and fields:
            kib[key] = _int(fields[0], path, f"line {no} {key}")
    if "MemTotal" not in kib:
        raise ProcFormatError(path, "has no MemTotal line")
    total = kib["MemTotal"]
    if "MemAvailable" in kib:
        available = kib["MemAvailable"]
    elif "MemFree" in kib:
        available = kib["MemFree"] + kib.get("Buffers", 0) + kib.get("Cached", 0)
    else:
        raise ProcFormatError(path, "has neither MemAvailable nor MemFree")
    return float((total - available) * 1024), float(total * 1024)


def parse_net_dev(text: str, path: str = "net/dev") -> dict[str, tuple[int, int]]:
    """Per interface ``(rx_bytes, tx_bytes)`` from ``/proc/net/dev`` (two header lines)."""
    lines = text.splitlines()
    if len(lines) < 2 or "|" not in lines[0]:
        raise ProcFormatError(path, "lacks the two header lines")
    out: dict[str, tuple[int, int]] = {}
    for no, line in enumerate(lines[2:], 3):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16:
            raise ProcFormatError(path, f"line {no}: expected '<iface>: <16 counters>'")
        iface = name.strip()
        out[iface] = (
            _int(fields[0], path, f"line {no} {iface} rx_bytes"),
            _int(fields[8], path, f"line {no} {iface} tx_bytes"),
        )
    return out
