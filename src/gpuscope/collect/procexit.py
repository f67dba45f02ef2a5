"""When watched processes exit, and how: the kernel's process-event connector, else /proc polling.

The connector (netlink ``NETLINK_CONNECTOR``, multicast group ``CN_IDX_PROC``) sends a
``PROC_EVENT_EXIT`` for every task that exits, with the wait status and the kernel's monotonic
time of the exit, so a SIGKILLed process (which cannot say anything itself) is named with its
signal and the moment it died. It needs root (CAP_NET_ADMIN) and the host's network namespace;
where it cannot be opened, :class:`ProcPoll` reports that a watched process disappeared from
/proc, without a code, at the time it was noticed.

Layouts from torvalds/linux include/uapi/linux/cn_proc.h (``struct proc_event``,
``exit_proc_event``, ``PROC_CN_MCAST_LISTEN``, ``PROC_EVENT_EXIT``) and include/uapi/linux/connector.h
(``struct cn_msg``, ``CN_IDX_PROC``, ``CN_VAL_PROC``) at 011b1134b82c2750d83a299a1369c678845de45a.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # id.idx, id.val, seq, ack, len, flags
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (CLOCK_MONOTONIC)
_EXIT = struct.Struct("=iiII")  # process_pid, process_tgid, exit_code (wait status), exit_signal


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A process that ended: when (wall clock), and its status when the kernel told it."""

    pid: int
    ts: float
    exit_code: int | None = None  # the status it exited with (None: killed, or not known)
    signal: str | None = None  # the signal that killed it (SIGKILL, ...)

    @property
    def known(self) -> bool:
        return self.exit_code is not None or self.signal is not None

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {self.signal}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return "its process is gone (exit status unknown)"


def decode_status(status: int) -> tuple[int | None, str | None]:
    """(exit code, signal name) from a wait status (``WIFSIGNALED``/``WEXITSTATUS``)."""
    sig = status & 0x7F
    if sig:
        try:
            return None, signal.Signals(sig).name
        except ValueError:
            return None, f"signal {sig}"
    return (status >> 8) & 0xFF, None


def parse_exits(data: bytes, now_wall: float, now_mono_ns: int) -> list[ProcessExit]:
    """The process (thread-group leader) exits in one datagram from the connector."""
    out: list[ProcessExit] = []
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, _type, _flags, _seq, _pid = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size:
            break
        body = offset + _NLMSG.size
        if body + _CN_MSG.size + _EVENT.size + _EXIT.size <= offset + length:
            idx, val = _CN_MSG.unpack_from(data, body)[:2]
            event = body + _CN_MSG.size
            what, _cpu, ts_ns = _EVENT.unpack_from(data, event)
            if (idx, val) == (CN_IDX_PROC, CN_VAL_PROC) and what == PROC_EVENT_EXIT:
                pid, tgid, status, _exit_signal = _EXIT.unpack_from(data, event + _EVENT.size)
                if pid == tgid:  # a thread's exit is not its process's
                    code, sig = decode_status(status)
                    out.append(ProcessExit(tgid, now_wall - (now_mono_ns - ts_ns) / 1e9, code, sig))
        offset += (length + 3) & ~3
    return out


class ExitWatcher(Protocol):
    """Tells which of the watched processes ended since the last call."""

    source: str

    def exits(self, watched: Iterable[int], now: float) -> list[ProcessExit]: ...

    def close(self) -> None: ...


class ProcPoll:
    """The fallback: a watched pid no longer in /proc has ended (no status, noticed at ``now``)."""

    source = "proc"

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def exits(self, watched: Iterable[int], now: float) -> list[ProcessExit]:
        return [ProcessExit(pid, now) for pid in watched if not _alive(self.proc_root, pid)]

    def close(self) -> None:
        pass


class ProcConnector:
    """Exit events from the kernel's process-event connector; raises OSError where it cannot open.

    Exits of unwatched processes are dropped; a watched pid gone from /proc with no event (the
    event was lost to a full socket buffer) is still reported, as :class:`ProcPoll` would."""

    source = "connector"

    def __init__(self, proc_root: str = "/proc", rcvbuf: int = 4 * 1024 * 1024) -> None:
        self.proc_root = proc_root
        self._poll = ProcPoll(proc_root)
        family = getattr(socket, "AF_NETLINK", None)
        if family is None:
            raise OSError("netlink sockets exist on Linux only")
        sock = socket.socket(family, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.bind((0, CN_IDX_PROC))
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            sock.send(_NLMSG.pack(_NLMSG.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def exits(self, watched: Iterable[int], now: float) -> list[ProcessExit]:
        pids = set(watched)
        found: dict[int, ProcessExit] = {}
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # overrun: some events lost, /proc covers them
                    continue
                raise
            for ended in parse_exits(data, time.time(), time.monotonic_ns()):
                if ended.pid in pids:
                    found.setdefault(ended.pid, ended)
        rest = [pid for pid in pids if pid not in found]
        return [*found.values(), *self._poll.exits(rest, now)]

    def close(self) -> None:
        self._sock.close()


def stat_fields(proc_root: str, pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (state, ppid, ...); None when it is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()
    except OSError:
        return None


def _alive(proc_root: str, pid: int) -> bool:
    """In /proc and not a zombie (a zombie has exited; only its parent has not reaped it)."""
    fields = stat_fields(proc_root, pid)
    return fields is not None and fields[:1] != ["Z"]


def open_exit_watcher(proc_root: str = "/proc") -> ExitWatcher:
    """The connector where it can be opened (root, the host's namespace), else /proc polling."""
    if proc_root == "/proc":
        try:
            return ProcConnector(proc_root)
        except OSError:
            pass
    return ProcPoll(proc_root)
