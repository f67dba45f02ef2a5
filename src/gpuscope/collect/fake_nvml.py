"""A faithful fake of pynvml, so tests and the simulator drive the real NVML collector code.

:class:`FakeNvml` exposes the pynvml function names the collector uses, returns what pynvml
returns (ctypes structs where pynvml returns them, handles of pynvml's handle type) and raises
pynvml's own :class:`NVMLError` subclasses with NVML's codes. Its state is a list of
:class:`FakeGpu` objects (NVML units: mW, mJ, ns, KB/s) that a test or the simulator edits;
helpers set the named fault states: throttling, ECC errors, XIDs, a lost GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml  # type: ignore[import-untyped]

from gpuscope.collect.nvml_api import address

_addresses = itertools.count(0x1000, 0x10)

#: Reason bits of ``nvmlDeviceGetCurrentClocksEventReasons``.
SW_POWER = int(pynvml.nvmlClocksEventReasonSwPowerCap)
HW_SLOWDOWN = int(pynvml.nvmlClocksEventReasonHwSlowdown)
SW_THERMAL = int(pynvml.nvmlClocksEventReasonSwThermalSlowdown)
HW_THERMAL = int(pynvml.nvmlClocksEventReasonHwThermalSlowdown)
HW_POWER_BRAKE = int(pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)
IDLE = int(pynvml.nvmlClocksEventReasonGpuIdle)

GPM_SM = int(pynvml.NVML_GPM_METRIC_SM_UTIL)
GPM_OCCUPANCY = int(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY)
GPM_TENSOR = int(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
GPM_DRAM = int(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)


def _pointer(kind: Any) -> Any:
    """A handle of pynvml's pointer type with a unique fake address (never dereferenced)."""
    return ctypes.cast(ctypes.c_void_p(next(_addresses)), kind)


def nvml_error(code: int) -> Exception:
    """pynvml's exception for ``code`` (``NVMLError(15)`` is an ``NVMLError_GpuIsLost``)."""
    err: Exception = pynvml.NVMLError(code)
    return err


@dataclass(slots=True)
class FakeLink:
    active: bool = True
    tx_kib: int = 0  # cumulative, as NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    rx_kib: int = 0
    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0
    crc_data: int = 0


@dataclass(slots=True)
class FakeProcess:
    pid: int
    used_bytes: int
    gpu_instance: int = 0xFFFFFFFF
    compute_instance: int = 0xFFFFFFFF


@dataclass(slots=True)
class FakeMig:
    gpu_instance: int
    compute_instance: int
    uuid: str
    total: int
    used: int
    gpm: dict[int, float] = field(default_factory=dict)
    handle: Any = None


@dataclass(slots=True)
class FakeGpu:
    """One GPU's state, in NVML's own units."""

    uuid: str
    bus_id: str  # "00000000:9B:00.0", as nvmlPciInfo_t.busId
    name: str = "NVIDIA H100 80GB HBM3"
    util_gpu: int = 0
    util_mem: int = 0
    total: int = 85_520_809_984
    reserved: int = 502_267_904
    used: int = 0
    temp: int = 32
    mem_temp: int = 35
    power_mw: int = 70_000
    limit_mw: int = 700_000
    energy_mj: int = 0
    sm_clock: int = 345
    mem_clock: int = 2619
    reasons: int = IDLE
    violation_ns: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    #: (error type, counter type) -> count; 0 corrected / 1 uncorrected, 0 volatile / 1 aggregate
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: dict.fromkeys(itertools.product((0, 1), (0, 1)), 0)
    )
    retired: dict[int, list[int]] = field(default_factory=lambda: {0: [], 1: []})
    retired_pending: bool = False
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    pcie_replay: int = 0
    links: list[FakeLink] = field(default_factory=lambda: [FakeLink() for _ in range(18)])
    processes: list[FakeProcess] = field(default_factory=list)
    #: GPM metric id -> percent; None: the GPU does not support GPM
    gpm: dict[int, float] | None = field(
        default_factory=lambda: dict.fromkeys((GPM_SM, GPM_OCCUPANCY, GPM_TENSOR, GPM_DRAM), 0.0)
    )
    mig: list[FakeMig] = field(default_factory=list)
    lost: bool = False
    #: pynvml function names that answer NVML_ERROR_NOT_SUPPORTED on this GPU
    unsupported: set[str] = field(default_factory=set)
    handle: Any = None


class FakeNvml:
    """The pynvml functions the collector calls, over editable :class:`FakeGpu` state."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        for gpu in gpus:
            gpu.handle = _pointer(pynvml.c_nvmlDevice_t)
            for mig in gpu.mig:
                mig.handle = _pointer(pynvml.c_nvmlDevice_t)
        self.initialised = 0
        self.calls = 0
        self._by_address = {address(g.handle): g for g in gpus}
        self._migs = {address(m.handle): (g, m) for g in gpus for m in g.mig}
        self._cond = threading.Condition()
        self._events: deque[tuple[Any, int, int]] = deque()
        self._taken = 0  # events handed out by nvmlEventSetWait_v2
        self._handled = 0  # of those, the ones the waiter is known to be done with
        self._registered: dict[int, int] = {}  # gpu handle address -> event mask
        self._gpm_samples: dict[int, dict[int, float]] = {}

    def __getattr__(self, name: str) -> Any:
        """Constants and struct types (``NVML_CLOCK_SM``, ``c_nvmlMemory_v2_t``) are pynvml's own."""
        if name.startswith(("NVML_", "nvmlClocks", "nvmlEventType", "c_nvml", "nvmlMemory_v")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    @classmethod
    def healthy(cls, count: int = 8) -> FakeNvml:
        """``count`` idle H100s on the PCI addresses of a real 8-GPU HGX board."""
        buses = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
        gpus = [
            FakeGpu(
                uuid=f"GPU-{i:08x}-0000-4000-8000-{i:012x}",
                bus_id=f"00000000:{buses[i % 8]}:{i // 8:02X}.0",
            )
            for i in range(count)
        ]
        return cls(gpus)

    # --- fault states ------------------------------------------------------------------------

    def throttle(self, index: int, reasons: int, sm_clock: int = 1200) -> None:
        gpu = self.gpus[index]
        gpu.reasons, gpu.sm_clock = reasons, sm_clock

    def ecc_errors(self, index: int, *, corrected: int = 0, uncorrected: int = 0) -> None:
        """Add ECC errors to the volatile and aggregate counters; a DBE also raises its event."""
        gpu = self.gpus[index]
        for counter in (0, 1):
            gpu.ecc[(0, counter)] += corrected
            gpu.ecc[(1, counter)] += uncorrected
        if uncorrected:
            self._post(gpu, int(pynvml.nvmlEventTypeDoubleBitEccError), uncorrected)

    def xid(self, index: int, code: int) -> None:
        self._post(self.gpus[index], int(pynvml.nvmlEventTypeXidCriticalError), code)

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True

    def restore(self, index: int) -> None:
        """The GPU back after a reset (``nvidia-smi -r``): it answers again with the same handle,
        its volatile ECC counters are zero, its processes are gone and what waited for the reset
        (page retirement, a row remap) is done. Aggregate counters survive, as on a real GPU."""
        gpu = self.gpus[index]
        gpu.lost = False
        gpu.ecc[(0, 0)] = gpu.ecc[(1, 0)] = 0
        gpu.processes.clear()
        gpu.retired_pending = False
        correctable, uncorrectable, _, failure = gpu.remapped
        gpu.remapped = (correctable, uncorrectable, 0, failure)

    def wait_events_taken(self, timeout: float) -> bool:
        """Wait until every posted event was taken by ``nvmlEventSetWait`` and the waiter came back
        for more (so it has handled what it took); False on timeout. Lets a driver that posts an
        event and then collects be sure the event thread has passed it on, without sleeping."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._events and self._handled == self._taken, timeout)

    def _post(self, gpu: FakeGpu, kind: int, data: int) -> None:
        with self._cond:
            if self._registered.get(address(gpu.handle), 0) & kind:
                self._events.append((gpu.handle, kind, data))
                self._cond.notify_all()

    # --- library -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if self.initialised <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def _check(self) -> None:
        self.calls += 1
        if self.initialised <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        self._check()
        key = address(handle)
        gpu = self._by_address.get(key)
        if gpu is None:
            mig = self._migs.get(key)
            if mig is None:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = mig[0]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, handle: Any) -> FakeMig | None:
        found = self._migs.get(address(handle))
        return found[1] if found else None

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index].handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        mig = self._mig(handle)
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        domain, bus, rest = gpu.bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu, gpu.util_mem
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mig = self._mig(handle)
        total, reserved, used = (mig.total, 0, mig.used) if mig else (gpu.total, gpu.reserved, gpu.used)
        if version:
            mem = pynvml.c_nvmlMemory_v2_t()
            mem.version, mem.reserved = version, reserved
        else:
            mem = pynvml.c_nvmlMemory_t()
            used += reserved  # v1 counts the driver's reservation as used
        mem.total, mem.used, mem.free = total, used, total - used - (reserved if version else 0)
        return mem

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        clocks = {pynvml.NVML_CLOCK_SM: gpu.sm_clock, pynvml.NVML_CLOCK_MEM: gpu.mem_clock}
        if kind not in clocks:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return clocks[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetViolationStatus")
        if policy not in gpu.violation_ns:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = pynvml.c_nvmlViolationTime_t()
        out.referenceTime, out.violationTime = 1, gpu.violation_ns[policy]
        return out

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if (error_type, counter_type) not in gpu.ecc:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        return list(self._gpu(handle, "nvmlDeviceGetRetiredPages").retired[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPcieThroughput")
        return gpu.pcie_tx_kbps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbps

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def _link(self, handle: Any, link: int, fn: str) -> FakeLink:
        gpu = self._gpu(handle, fn)
        if not 0 <= link < len(gpu.links):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return int(self._link(handle, link, "nvmlDeviceGetNvLinkState").active)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        lk = self._link(handle, link, "nvmlDeviceGetNvLinkErrorCounter")
        by_counter = {
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: lk.replay,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: lk.recovery,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: lk.crc_flit,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: lk.crc_data,
        }
        if counter not in by_counter:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return by_counter[counter]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        """Per field a ``c_nvmlFieldValue_t``; an unknown field sets its own nvmlReturn, as NVML does."""
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            field_id, scope = fid if isinstance(fid, tuple) else (fid, 0)
            values[i].fieldId, values[i].scopeId = field_id, scope
            got = self._field(gpu, field_id, scope)
            if got is None:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = got
        return values

    @staticmethod
    def _field(gpu: FakeGpu, field_id: int, scope: int) -> int | None:
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return gpu.mem_temp
        if field_id in (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ):
            tx = field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            links = gpu.links if scope == 0xFFFFFFFF else gpu.links[scope : scope + 1]
            return sum(lk.tx_kib if tx else lk.rx_kib for lk in links)
        return None

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        out = []
        for p in gpu.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory = p.pid, p.used_bytes
            info.gpuInstanceId, info.computeInstanceId = p.gpu_instance, p.compute_instance
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    # --- MIG ---------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        mode = int(bool(self._gpu(handle, "nvmlDeviceGetMigMode").mig))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7 if self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount").mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < len(gpu.mig):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.mig[index].handle

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance

    # --- GPM ---------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version, support.isSupportedDevice = pynvml.NVML_GPM_SUPPORT_VERSION, int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check()
        sample = _pointer(pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[address(sample)] = {}
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check()
        if self._gpm_samples.pop(address(sample), None) is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmSampleGet")
        if gpu.gpm is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_samples[address(sample)] = dict(gpu.gpm)
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance: int, sample: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmMigSampleGet")
        mig = next((m for m in gpu.mig if m.gpu_instance == gpu_instance), None)
        if mig is None or gpu.gpm is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_samples[address(sample)] = dict(mig.gpm)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """Fills ``request.metrics[i].value`` from the second sample, as NVML does from the pair."""
        self._check()
        first = self._gpm_samples.get(address(request.sample1))
        second = self._gpm_samples.get(address(request.sample2))
        if first is None or second is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in second:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second[metric.metricId]
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    # --- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._check()
        return _pointer(pynvml.c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        with self._cond:
            self._registered[address(gpu.handle)] = mask

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._check()
        with self._cond:
            self._handled = self._taken  # a waiter back for more is done with what it took
            self._cond.notify_all()
            if not self._events:
                self._cond.wait(timeout_ms / 1000)
            if not self._events:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            handle, kind, data = self._events.popleft()
            self._taken += 1
        out = pynvml.c_nvmlEventData_t()
        out.device, out.eventType, out.eventData = handle, kind, data
        out.gpuInstanceId = out.computeInstanceId = 0xFFFFFFFF
        return out

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check()
