"""XIDs from the kernel log: the ``kmsg`` collector.

The driver prints every Xid to the kernel log (``NVRM: Xid (PCI:0000:9b:00): 119, pid=...``),
including those NVML never reports as events (79 fallen off the bus, 119/120 GSP timeouts).
The collector reads ``/dev/kmsg`` without blocking (or a saved ``dmesg`` file), maps the PCI
address to the GPU index through ``<proc_root>/driver/nvidia/gpus/<bus id>/information``
(NVML numbers GPUs in PCI bus order), and emits ``xid`` events. By default it starts at the end
of ``/dev/kmsg``: XIDs from before the agent started were already reported, or are history.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from dataclasses import dataclass
from typing import Self

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.model import Event

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?\): "
    r"(?P<code>[0-9]{1,9})(?![0-9])(?:, pid=(?P<pid>[^,]*), name=(?P<name>[^,]*))?,? ?(?P<message>.*)$"
)
_UUID = re.compile(r"^GPU UUID:\s*(\S+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class KernelXid:
    pci: str  # normalised "0000:9b:00"
    code: int
    pid: str | None
    process: str | None
    message: str


def normalise_pci(address: str) -> str:
    """``00000000:9B:00.0`` or ``0000:9b:00`` -> ``0000:9b:00`` (4-digit domain, no function)."""
    parts = address.lower().split(".")[0].split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, device = parts
    return f"{int(domain, 16):04x}:{bus}:{device}"


def parse_xid_line(line: str) -> KernelXid | None:
    """The XID in one kernel log line (kmsg ``prio,seq,ts,-;text`` or dmesg ``[ts] text``), if any."""
    m = _XID.search(line)
    if m is None:
        return None
    pid = (m.group("pid") or "").strip("'") or None
    name = (m.group("name") or "").strip() or None
    return KernelXid(
        normalise_pci(m.group("pci")), int(m.group("code")), pid, name, m.group("message").strip()
    )


def gpu_map(proc_root: str = "/proc") -> dict[str, tuple[int, str]]:
    """``{pci: (gpu index, uuid)}`` from ``<proc_root>/driver/nvidia/gpus``; empty without a driver."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        entries = sorted(os.listdir(base), key=normalise_pci)
    except (OSError, ValueError):
        return {}
    out: dict[str, tuple[int, str]] = {}
    for index, entry in enumerate(entries):
        uuid = ""
        try:
            with open(os.path.join(base, entry, "information"), encoding="utf-8", errors="replace") as fh:
                if m := _UUID.search(fh.read()):
                    uuid = m.group(1)
        except OSError:
            pass  # the index alone still places the XID
        out[normalise_pci(entry)] = (index, uuid)
    return out


@register_collector
class KernelLogCollector(Collector):
    """``xid`` events from ``/dev/kmsg`` or a dmesg file (option ``kmsg_path``)."""

    name = "kmsg"
    default = sys.platform.startswith("linux") and os.path.isdir("/proc/driver/nvidia/gpus")
    enabled_by = ("kmsg_path",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        path: str = "/dev/kmsg",
        from_start: bool | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.path = path
        self.is_kmsg = path == "/dev/kmsg"
        self.from_start = (not self.is_kmsg) if from_start is None else from_start
        self._fd: int | None = None
        self._partial = b""
        self._gpus: dict[str, tuple[int, str]] | None = None
        self.lines_lost = 0

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        path = str(ctx.options.get("kmsg_path") or "/dev/kmsg")
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root, path=path)

    def _open(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if not self.from_start:
                os.lseek(fd, 0, os.SEEK_END)
            self._fd = fd
        return self._fd

    def _read_lines(self, errors: list[CollectorError]) -> list[str]:
        fd = self._open()
        lines: list[str] = []
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # kmsg overwrote records we had not read yet
                    self.lines_lost += 1
                    errors.append(
                        CollectorError("kmsg_overrun", f"{self.path}: kernel log records were lost")
                    )
                    continue
                raise
            if not chunk:
                break
            if self.is_kmsg:
                lines.append(chunk.decode(errors="replace"))  # one record per read
            else:
                data = self._partial + chunk
                *complete, self._partial = data.split(b"\n")
                lines.extend(c.decode(errors="replace") for c in complete)
        return lines

    def collect(self, now: float) -> Collected:
        out = Collected()
        lines = self._read_lines(out.errors)
        for line in lines:
            xid = parse_xid_line(line)
            if xid is None:
                continue
            if self._gpus is None or xid.pci not in self._gpus:
                self._gpus = gpu_map(self.proc_root)
            labels = {"node": self.node}
            where = self._gpus.get(xid.pci)
            if where is not None:
                labels["gpu"] = str(where[0])
                if where[1]:
                    labels["uuid"] = where[1]
            else:
                out.errors.append(
                    CollectorError("kmsg_unknown_gpu", f"Xid {xid.code} on unknown GPU {xid.pci}")
                )
            data = {"code": xid.code, "message": xid.message, "pci": xid.pci, "source": "kmsg"}
            if xid.pid:
                data["pid"] = xid.pid
            if xid.process:
                data["process"] = xid.process
            out.events.append(Event(now, "xid", labels, data))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
