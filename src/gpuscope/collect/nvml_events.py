"""XID and ECC events from an NVML event set, waited on by a thread of its own.

``nvmlEventSetWait`` blocks, so it runs beside the collection rounds: every event becomes an
:class:`~gpuscope.model.Event` (``xid`` with its code, ``ecc_dbe``, ``gpu_lost`` for a GPU that
became unavailable) queued for the next round. The wait has a short timeout so the thread stops
promptly; a failing wait is counted and retried after a pause, never ends the thread silently.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuscope.collect.base import CollectorError
from gpuscope.collect.nvml_api import ERROR_TIMEOUT, Device, NvmlSession, address
from gpuscope.model import Event, Labels

XID = 0x8
DBE = 0x2
GPU_UNAVAILABLE = 0x4000
WANTED = XID | DBE | GPU_UNAVAILABLE


class EventWatcher:
    """Registers every GPU for XID/DBE events and queues what arrives until :meth:`drain`."""

    def __init__(
        self,
        session: NvmlSession,
        devices: list[Device],
        labels: Callable[[Device], Labels],
        *,
        wait_ms: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session = session
        self.labels = labels
        self.wait_ms = wait_ms
        self.clock = clock
        self._by_handle = {address(d.handle): d for d in devices}
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._errors: list[CollectorError] = []
        self._stop = threading.Event()
        self._set: Any = session.call_lib("events", "nvmlEventSetCreate")
        self.registered = 0
        if self._set is not None:
            for dev in devices:
                mask = session.probe(dev, "nvmlDeviceGetSupportedEventTypes")
                mask = WANTED if mask is None else int(mask) & WANTED
                if mask and session.probe(dev, "nvmlDeviceRegisterEvents", mask, self._set) is None:
                    self.registered += 1
        self._thread = threading.Thread(target=self._run, name="gpuscope-nvml-events", daemon=True)
        if self._set is not None:
            self._thread.start()

    def _run(self) -> None:
        lib = self.session.lib
        while not self._stop.is_set():
            try:
                data = lib.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) == ERROR_TIMEOUT:
                    continue
                with self._lock:
                    self._errors.append(CollectorError("nvml_event_wait", f"nvmlEventSetWait: {exc}"))
                self._stop.wait(1.0)
                continue
            self._queue(data)

    def _queue(self, data: Any) -> None:
        dev = self._by_handle.get(address(data.device))
        if dev is None:
            return
        labels = self.labels(dev)
        kind, value, now = int(data.eventType), int(data.eventData), self.clock()
        if kind & XID:
            event = Event(now, "xid", labels, {"code": value, "message": "", "source": "nvml"})
        elif kind & DBE:
            event = Event(now, "ecc_dbe", labels, {"count": max(1, value), "source": "nvml"})
        else:
            event = Event(now, "gpu_lost", labels, {"reason": "GPU unavailable event", "source": "nvml"})
        with self._lock:
            self._events.append(event)

    def drain(self) -> tuple[list[Event], list[CollectorError]]:
        with self._lock:
            events, errors = self._events, self._errors
            self._events, self._errors = [], []
        return events, errors

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.wait_ms / 1000 + 2)
        if self._set is not None:
            self.session.call_lib("events", "nvmlEventSetFree", self._set)
            self._set = None
