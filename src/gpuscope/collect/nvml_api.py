"""The one choke point through which every NVML call goes.

:class:`NvmlSession` initialises NVML once, keeps the device handles, and isolates errors per
metric: a function a GPU does not support is remembered and skipped from then on (never an
error, never dropping other fields); a GPU that answers "GPU is lost" or "unknown error" raises
:class:`GpuLost` so the collector turns it into a ``gpu_lost`` event; any other failure is kept
as a :class:`CollectorError` for the round and the other fields go on. The library is pynvml or
anything with its names (:class:`~gpuscope.collect.fake_nvml.FakeNvml`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from dataclasses import dataclass, field
from typing import Any

from gpuscope.collect.base import CollectorError

#: NVML return codes (pynvml's values), named here so this module needs no pynvml at import.
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_GPU_NOT_FOUND = 28
ERROR_UNKNOWN = 999

#: Answers that mean the field is not there on this GPU or driver: skip it from now on.
UNSUPPORTED = frozenset({ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_FUNCTION_NOT_FOUND})
#: Answers that mean the GPU itself is gone.
LOST = frozenset({ERROR_GPU_IS_LOST, ERROR_UNKNOWN, ERROR_GPU_NOT_FOUND})


def address(handle: Any) -> int:
    """The address a pynvml handle (real or fake) points at, to use as a dictionary key."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def nvml_library_present() -> bool:
    """Whether the driver's NVML library can be found, without loading it."""
    return ctypes.util.find_library("nvidia-ml") is not None


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, no library)."""


class GpuLost(Exception):
    """A GPU answered with an error that means it is gone."""

    def __init__(self, device: Device, function: str, code: int, message: str) -> None:
        super().__init__(f"GPU {device.label} lost: {function}: {message} (NVML error {code})")
        self.device, self.function, self.code, self.message = device, function, code, message


@dataclass(slots=True)
class Device:
    """A GPU, or a MIG instance of one, with the handle NVML gave for it."""

    index: int
    handle: Any
    uuid: str
    bus_id: str = ""
    name: str = ""
    #: MIG instances: (gpu instance id, compute instance id); None for a whole GPU
    mig: tuple[int, int] | None = None
    children: list[Device] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.index) if self.mig is None else f"{self.index} mig {self.mig[0]}.{self.mig[1]}"


def _code(exc: BaseException) -> int:
    return int(getattr(exc, "value", ERROR_UNKNOWN))


class NvmlSession:
    """Initialises NVML once, enumerates devices once, and funnels every call through :meth:`call`."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            import pynvml  # type: ignore[import-untyped]

            lib = pynvml
        self.lib = lib
        self.devices: list[Device] = []
        #: (device uuid, field) pairs NVML said it does not support: not asked again
        self.unsupported: set[tuple[str, str]] = set()
        self.errors: list[CollectorError] = []
        self._open = False
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> list[Device]:
        """``nvmlInit`` and enumeration, once; raises :class:`NvmlUnavailable` when NVML cannot start."""
        with self._lock:
            if self._open:
                return self.devices
            try:
                self.lib.nvmlInit()
            except self.lib.NVMLError as exc:
                raise NvmlUnavailable(f"NVML cannot start: {exc} (NVML error {_code(exc)})") from exc
            self._open = True
            try:
                self.devices = [self._device(i) for i in range(self.lib.nvmlDeviceGetCount())]
            except self.lib.NVMLError as exc:
                self.close_locked()
                raise NvmlUnavailable(f"NVML cannot enumerate GPUs: {exc}") from exc
            return self.devices

    def _device(self, index: int) -> Device:
        handle = self.lib.nvmlDeviceGetHandleByIndex(index)
        dev = Device(index=index, handle=handle, uuid=_text(self.lib.nvmlDeviceGetUUID(handle)))
        try:
            dev.name = _text(self.lib.nvmlDeviceGetName(handle))
            dev.bus_id = _text(self.lib.nvmlDeviceGetPciInfo(handle).busId)
        except self.lib.NVMLError as exc:
            if _code(exc) in LOST:
                return dev  # the first round reports it lost
        dev.children = self._mig_children(dev)
        return dev

    def _mig_children(self, dev: Device) -> list[Device]:
        try:
            if self.lib.nvmlDeviceGetMigMode(dev.handle)[0] != 1:
                return []
            count = self.lib.nvmlDeviceGetMaxMigDeviceCount(dev.handle)
        except self.lib.NVMLError:
            return []  # no MIG on this GPU
        children = []
        for i in range(count):
            try:
                h = self.lib.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
                gi = self.lib.nvmlDeviceGetGpuInstanceId(h)
                ci = self.lib.nvmlDeviceGetComputeInstanceId(h)
                children.append(
                    Device(index=dev.index, handle=h, uuid=_text(self.lib.nvmlDeviceGetUUID(h)), mig=(gi, ci))
                )
            except self.lib.NVMLError:
                continue  # an empty MIG slot answers NOT_FOUND
        return children

    def supported(self, dev: Device, what: str) -> bool:
        return (dev.uuid, what) not in self.unsupported

    def call(self, dev: Device, what: str, fn: str, *args: Any) -> Any:
        """``lib.<fn>(dev.handle, *args)``; None when unsupported or failed (failure kept in ``errors``).

        ``what`` names the field for the unsupported set and error kinds (``"ecc"``).
        """
        if (dev.uuid, what) in self.unsupported:
            return None
        try:
            return getattr(self.lib, fn)(dev.handle, *args)
        except self.lib.NVMLError as exc:
            return self._failed(dev, what, fn, exc)

    def _failed(self, dev: Device, what: str, fn: str, exc: BaseException) -> None:
        code = _code(exc)
        if code in LOST:
            raise GpuLost(dev, fn, code, str(exc)) from exc
        if code in UNSUPPORTED:
            self.unsupported.add((dev.uuid, what))
            return None
        self.errors.append(
            CollectorError(f"nvml_{what}", f"GPU {dev.label}: {fn}: {exc} (NVML error {code})")
        )
        return None

    def probe(self, dev: Device, fn: str, *args: Any) -> Any:
        """Like :meth:`call` but a failure is an answer (None), not an error: for discovery."""
        try:
            return getattr(self.lib, fn)(dev.handle, *args)
        except self.lib.NVMLError as exc:
            if _code(exc) in LOST:
                raise GpuLost(dev, fn, _code(exc), str(exc)) from exc
            return None

    def call_lib(self, what: str, fn: str, *args: Any) -> Any:
        """A call that takes no device handle first (event sets, GPM samples); None on failure."""
        try:
            return getattr(self.lib, fn)(*args)
        except self.lib.NVMLError as exc:
            self.errors.append(CollectorError(f"nvml_{what}", f"{fn}: {exc} (NVML error {_code(exc)})"))
            return None

    def take_errors(self) -> list[CollectorError]:
        out, self.errors = self.errors, []
        return out

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(self.lib.NVMLError):  # a driver that already went away
                self.lib.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def uuid_indices(lib: Any = None) -> dict[str, str]:
    """NVML's ``{uuid: index}`` of every GPU and MIG instance (a MIG instance maps to its GPU's
    index); empty when NVML cannot start. For a process that only knows its GPU by UUID."""
    session = NvmlSession(lib)
    try:
        devices = session.open()
    except NvmlUnavailable:
        return {}
    try:
        out: dict[str, str] = {}
        for dev in devices:
            out[dev.uuid] = str(dev.index)
            for child in dev.children:
                out[child.uuid] = str(dev.index)
        return out
    finally:
        session.close()
