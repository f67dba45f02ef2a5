"""Per-GPU telemetry from NVML: the ``nvml`` collector.

Everything goes through :class:`~gpuscope.collect.nvml_api.NvmlSession`, so one unsupported
field never drops the rest and a GPU that is lost becomes one ``gpu_lost`` event. Per round:
the per-GPU frame (``signals.GPU_METRICS``, labelled with the job using the GPU), a frame per
NVLink link, a frame per GPU process, and MIG instances as entities of their own (label
``mig``). Counters that change slowly (ECC, retired pages, remapped rows, violation times,
NVLink errors, PCIe replays) are read every ``slow_every`` rounds. XIDs and DBEs arrive through
an event set on a thread of its own. With ``--kubelet-socket`` (and ``--kube-api``) a process's pod
is named ``namespace/name`` as on every other path (:class:`~gpuscope.collect.podresources.PodNames`);
its process row keeps the UID as ``pod_uid``. A lost GPU is asked for its UUID each round and read again
once it answers (after a GPU reset).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any, Self

import numpy as np

from gpuscope.collect.attribution import ProcessOwner, process_owner
from gpuscope.collect.base import Collected, Collector, CollectorContext, register_collector
from gpuscope.collect.nvml_api import Device, GpuLost, NvmlSession, nvml_library_present
from gpuscope.collect.nvml_events import EventWatcher
from gpuscope.collect.podresources import PodNames, PodResourcesClient
from gpuscope.kube.metadata import DEFAULT_TEAM_LABEL, ApiServerPods
from gpuscope.model import Event, Frame, Labels
from gpuscope.signals import DETAIL_METRICS, GPU_METRICS

ALL_SCOPES = 0xFFFFFFFF
#: (clock event reason bit, flag metric)
REASON_FLAGS = (
    (0x04, "gpu_throttle_sw_power"),
    (0x08, "gpu_throttle_hw_slowdown"),
    (0x20, "gpu_throttle_sw_thermal"),
    (0x40, "gpu_throttle_hw_thermal"),
    (0x80, "gpu_throttle_hw_power_brake"),
)
REASON_NAMES = {
    0x01: "gpu_idle",
    0x02: "applications_clocks_setting",
    0x04: "sw_power_cap",
    0x08: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: GPM metric id -> our ratio metric (GPM reports percent)
GPM_METRICS = {
    2: "gpu_sm_active_ratio",
    3: "gpu_sm_occupancy_ratio",
    5: "gpu_tensor_active_ratio",
    10: "gpu_dram_active_ratio",
}
MIG_METRICS = (
    "gpu_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_total_bytes",
    *GPM_METRICS.values(),
)


def decode_reasons(mask: int) -> list[str]:
    """The named clock event (throttle) reasons set in ``mask``."""
    return [name for bit, name in REASON_NAMES.items() if mask & bit]


def frame(ts: float, order: Iterable[str], rows: list[tuple[Labels, dict[str, float]]]) -> Frame | None:
    """One frame of ``rows``; columns in ``order``, only those some row has; NaN where one lacks it."""
    present = {m for _, values in rows for m in values}
    metrics = [m for m in order if m in present]
    if not rows or not metrics:
        return None
    values = np.full((len(rows), len(metrics)), np.nan)
    for i, (_, row) in enumerate(rows):
        for j, m in enumerate(metrics):
            v = row.get(m)
            if v is not None and math.isfinite(v):
                values[i, j] = v
    return Frame(ts=ts, metrics=metrics, entities=[labels for labels, _ in rows], values=values)


class _Round:
    """What one round gathers before it becomes frames."""

    def __init__(self) -> None:
        self.gpus: list[tuple[Labels, dict[str, float]]] = []
        self.links: dict[tuple[str, int], tuple[Labels, dict[str, float]]] = {}
        self.procs: list[tuple[Labels, dict[str, float]]] = []
        self.migs: list[tuple[Labels, dict[str, float]]] = []
        self.events: list[Event] = []


@register_collector
class NvmlCollector(Collector):
    """GPU telemetry through NVML (pynvml, or :class:`~gpuscope.collect.fake_nvml.FakeNvml`)."""

    name = "nvml"
    default = nvml_library_present()
    enabled_by = ("nvml",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        lib: Any = None,
        slow_every: int = 5,
        watch_events: bool = True,
        pods: PodNames | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.pods = pods
        if slow_every < 1:
            raise ValueError(f"slow_every must be at least 1, got {slow_every}")
        self.session = NvmlSession(lib)
        self.slow_every = slow_every
        self.watch_events = watch_events
        self.watcher: EventWatcher | None = None
        self.lost: set[str] = set()
        self._round = 0
        self._links: dict[str, list[int]] = {}
        self._nvlink_prev: dict[str, tuple[float, dict[int, tuple[int, int]]]] = {}
        self._gpm_prev: dict[str, Any] = {}
        self._gpm_ok: dict[str, bool] = {}
        self._owners: dict[int, ProcessOwner] = {}

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        lib = ctx.options.get("nvml_lib")
        pods = None
        if ctx.options.get("kubelet_socket"):
            api = (
                ApiServerPods.in_cluster(
                    os.environ, team_label=str(ctx.options.get("team_label") or DEFAULT_TEAM_LABEL)
                )
                if ctx.options.get("kube_api")
                else None
            )
            pods = PodNames(ctx.node, client=PodResourcesClient(str(ctx.options["kubelet_socket"])), api=api)
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root, lib=lib, pods=pods)

    def labels(self, dev: Device) -> Labels:
        out = {"node": self.node, "gpu": str(dev.index), "uuid": dev.uuid}
        if dev.mig is not None:
            out["mig"] = f"{dev.mig[0]}.{dev.mig[1]}"
        return out

    def collect(self, now: float) -> Collected:
        devices = self.session.open()
        if self.watch_events and self.watcher is None:
            self.watcher = EventWatcher(self.session, devices, self.labels)
        slow = self._round % self.slow_every == 0
        self._round += 1
        r = _Round()
        seen_pids: set[int] = set()
        for dev in devices:
            if dev.uuid in self.lost:
                if not self._answers_again(dev):
                    continue
                self.lost.discard(dev.uuid)  # reset and back: read it like any other GPU
            try:
                self._read_gpu(dev, now, slow, r, seen_pids)
            except GpuLost as exc:
                self.lost.add(dev.uuid)
                self._drop_gpm(dev.uuid)
                r.events.append(
                    Event(
                        now,
                        "gpu_lost",
                        self.labels(dev),
                        {"reason": exc.message, "code": exc.code, "source": "nvml"},
                    )
                )
        self._owners = {pid: o for pid, o in self._owners.items() if pid in seen_pids}
        out = Collected(events=r.events)
        if self.watcher is not None:
            events, errors = self.watcher.drain()
            out.events.extend(events)
            out.errors.extend(errors)
        out.errors.extend(self.session.take_errors())
        if self.pods is not None:
            out.errors.extend(self.pods.take_errors())
        for order, rows in (
            (GPU_METRICS, r.gpus),
            (DETAIL_METRICS, list(r.links.values())),
            (DETAIL_METRICS, r.procs),
            (MIG_METRICS, r.migs),
        ):
            f = frame(now, order, rows)
            if f is not None:
                out.frames.append(f)
        return out

    def _answers_again(self, dev: Device) -> bool:
        """Whether a lost GPU answers with its own UUID again (after a GPU reset): one cheap call a
        round per lost GPU, so a reset GPU is monitored again without restarting the agent."""
        try:
            uuid = self.session.probe(dev, "nvmlDeviceGetUUID")
        except GpuLost:
            return False
        return (uuid.decode() if isinstance(uuid, bytes) else str(uuid)) == dev.uuid

    # --- one GPU -----------------------------------------------------------------------------

    def _read_gpu(self, dev: Device, now: float, slow: bool, r: _Round, seen_pids: set[int]) -> None:
        s, lib = self.session, self.session.lib
        v: dict[str, float] = {}
        util = s.call(dev, "utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            v["gpu_utilization_percent"], v["gpu_memory_utilization_percent"] = util.gpu, util.memory
        v.update(self._memory(dev))
        if (
            temp := s.call(dev, "temperature", "nvmlDeviceGetTemperature", lib.NVML_TEMPERATURE_GPU)
        ) is not None:
            v["gpu_temp_celsius"] = temp
        if (mw := s.call(dev, "power", "nvmlDeviceGetPowerUsage")) is not None:
            v["gpu_power_watts"] = mw / 1000
        if (mw := s.call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")) is not None:
            v["gpu_power_limit_watts"] = mw / 1000
        if (mj := s.call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption")) is not None:
            v["gpu_energy_joules_total"] = mj / 1000
        if (mhz := s.call(dev, "sm_clock", "nvmlDeviceGetClockInfo", lib.NVML_CLOCK_SM)) is not None:
            v["gpu_sm_clock_mhz"] = mhz
        if (mhz := s.call(dev, "mem_clock", "nvmlDeviceGetClockInfo", lib.NVML_CLOCK_MEM)) is not None:
            v["gpu_memory_clock_mhz"] = mhz
        if (mask := s.call(dev, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons")) is not None:
            v["gpu_clock_event_reasons"] = float(mask)
            for bit, flag in REASON_FLAGS:
                v[flag] = 1.0 if mask & bit else 0.0
        for counter, metric in ((lib.NVML_PCIE_UTIL_TX_BYTES, "tx"), (lib.NVML_PCIE_UTIL_RX_BYTES, "rx")):
            if (kbps := s.call(dev, "pcie_throughput", "nvmlDeviceGetPcieThroughput", counter)) is not None:
                v[f"gpu_pcie_{metric}_bytes_per_second"] = kbps * 1024.0
        v.update(self._gpm(dev))
        if slow:
            v.update(self._slow(dev))
            v.update(self._nvlink_errors(dev, r))
        v.update(self._nvlink_fields(dev, now, r))
        labels = self.labels(dev)
        owners = self._processes(dev, labels, r, seen_pids)
        if owners:
            labels.update(owners[0].labels())  # the process holding most memory speaks for the GPU
        r.gpus.append((labels, v))
        for child in dev.children:
            self._gpm_ok[child.uuid] = self._gpm_ok.get(dev.uuid, False)
            self._read_mig(child, r)

    def _memory(self, dev: Device) -> dict[str, float]:
        lib = self.session.lib
        mem = self.session.call(dev, "memory_v2", "nvmlDeviceGetMemoryInfo", lib.nvmlMemory_v2)
        if mem is not None:
            return {
                "gpu_memory_used_bytes": mem.used,
                "gpu_memory_free_bytes": mem.free,
                "gpu_memory_reserved_bytes": mem.reserved,
                "gpu_memory_total_bytes": mem.total,
            }
        mem = self.session.call(dev, "memory", "nvmlDeviceGetMemoryInfo")  # drivers before v2
        if mem is None:
            return {}
        return {
            "gpu_memory_used_bytes": mem.used,
            "gpu_memory_free_bytes": mem.free,
            "gpu_memory_total_bytes": mem.total,
        }

    def _slow(self, dev: Device) -> dict[str, float]:
        s, lib = self.session, self.session.lib
        v: dict[str, float] = {}
        for policy, metric in (
            (lib.NVML_PERF_POLICY_POWER, "gpu_violation_power_seconds_total"),
            (lib.NVML_PERF_POLICY_THERMAL, "gpu_violation_thermal_seconds_total"),
        ):
            if (t := s.call(dev, f"violation_{policy}", "nvmlDeviceGetViolationStatus", policy)) is not None:
                v[metric] = t.violationTime / 1e9
        for err, counter, metric in (
            (lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_VOLATILE_ECC, "gpu_ecc_sbe_volatile_total"),
            (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC, "gpu_ecc_dbe_volatile_total"),
            (lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_AGGREGATE_ECC, "gpu_ecc_sbe_aggregate_total"),
            (lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_AGGREGATE_ECC, "gpu_ecc_dbe_aggregate_total"),
        ):
            if (n := s.call(dev, "ecc", "nvmlDeviceGetTotalEccErrors", err, counter)) is not None:
                v[metric] = n
        for cause, metric in (
            (lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "gpu_retired_pages_sbe"),
            (lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "gpu_retired_pages_dbe"),
        ):
            if (pages := s.call(dev, "retired_pages", "nvmlDeviceGetRetiredPages", cause)) is not None:
                v[metric] = len(pages)
        if (pending := s.call(dev, "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus")) is not None:
            v["gpu_retired_pages_pending"] = float(bool(pending))
        if (rows := s.call(dev, "remapped_rows", "nvmlDeviceGetRemappedRows")) is not None:
            names = ("correctable", "uncorrectable", "pending", "failure")
            v.update({f"gpu_remapped_rows_{n}": float(x) for n, x in zip(names, rows, strict=True)})
        if (replays := s.call(dev, "pcie_replay", "nvmlDeviceGetPcieReplayCounter")) is not None:
            v["gpu_pcie_replay_total"] = replays
        return v

    # --- NVLink ------------------------------------------------------------------------------

    def _link_ids(self, dev: Device) -> list[int]:
        """The GPU's NVLink links, found once: those whose state NVML answers."""
        if dev.uuid not in self._links:
            lib = self.session.lib
            found = []
            for link in range(int(lib.NVML_NVLINK_MAX_LINKS)):
                state = self.session.probe(dev, "nvmlDeviceGetNvLinkState", link)
                if state is None:
                    break
                found.append(link)
            self._links[dev.uuid] = found
        return self._links[dev.uuid]

    def _link_row(self, r: _Round, dev: Device, link: int) -> dict[str, float]:
        """The values of one link this round (one row per link however many reads fill it)."""
        key = (dev.uuid, link)
        if key not in r.links:
            r.links[key] = ({**self.labels(dev), "link": str(link)}, {})
        return r.links[key][1]

    def _nvlink_errors(self, dev: Device, r: _Round) -> dict[str, float]:
        """Per-link state and error counters into ``r.links``; the GPU's totals returned."""
        s, lib = self.session, self.session.lib
        links = self._link_ids(dev)
        down = 0
        totals = dict.fromkeys(("crc", "replay", "recovery"), 0.0)
        for link in links:
            row = self._link_row(r, dev, link)
            state = s.call(dev, "nvlink_state", "nvmlDeviceGetNvLinkState", link)
            if state is not None:
                row["gpu_nvlink_link_up"] = float(state == 1)
                down += state != 1
            parts = {
                "crc": (lib.NVML_NVLINK_ERROR_DL_CRC_FLIT, lib.NVML_NVLINK_ERROR_DL_CRC_DATA),
                "replay": (lib.NVML_NVLINK_ERROR_DL_REPLAY,),
                "recovery": (lib.NVML_NVLINK_ERROR_DL_RECOVERY,),
            }
            for name, counters in parts.items():
                got = [
                    s.call(dev, "nvlink_errors", "nvmlDeviceGetNvLinkErrorCounter", link, c) for c in counters
                ]
                if all(g is not None for g in got):
                    row[f"gpu_nvlink_link_{name}_errors_total"] = float(sum(got))
                    totals[name] += row[f"gpu_nvlink_link_{name}_errors_total"]
        if not links:
            return {}
        return {
            "gpu_nvlink_links_down": float(down),
            "gpu_nvlink_crc_errors_total": totals["crc"],
            "gpu_nvlink_replay_errors_total": totals["replay"],
            "gpu_nvlink_recovery_errors_total": totals["recovery"],
        }

    def _nvlink_fields(self, dev: Device, now: float, r: _Round) -> dict[str, float]:
        """Memory temperature and NVLink throughput (per link, from cumulative KiB) in one call."""
        lib = self.session.lib
        links = self._link_ids(dev)
        tx_id, rx_id = lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        ids: list[Any] = [lib.NVML_FI_DEV_MEMORY_TEMP]
        for link in links:
            ids += [(tx_id, link), (rx_id, link)]
        got = self.session.call(dev, "field_values", "nvmlDeviceGetFieldValues", ids)
        v: dict[str, float] = {}
        if got is None:
            return v
        if got[0].nvmlReturn == lib.NVML_SUCCESS:
            v["gpu_memory_temp_celsius"] = float(_field_value(got[0]))
        counts: dict[int, tuple[int, int]] = {}
        for k, link in enumerate(links):
            tx, rx = got[1 + 2 * k], got[2 + 2 * k]
            if tx.nvmlReturn == lib.NVML_SUCCESS and rx.nvmlReturn == lib.NVML_SUCCESS:
                counts[link] = (int(_field_value(tx)), int(_field_value(rx)))
        prev = self._nvlink_prev.get(dev.uuid)
        self._nvlink_prev[dev.uuid] = (now, counts)
        if prev is None or now <= prev[0] or not counts:
            return v
        dt = now - prev[0]
        tx_sum = rx_sum = 0.0
        for link, (tx, rx) in counts.items():
            before = prev[1].get(link)
            if before is None or tx < before[0] or rx < before[1]:
                continue  # counter reset: no rate this round
            tx_rate, rx_rate = (tx - before[0]) * 1024 / dt, (rx - before[1]) * 1024 / dt
            tx_sum, rx_sum = tx_sum + tx_rate, rx_sum + rx_rate
            row = self._link_row(r, dev, link)
            row["gpu_nvlink_link_tx_bytes_per_second"] = tx_rate
            row["gpu_nvlink_link_rx_bytes_per_second"] = rx_rate
        v["gpu_nvlink_tx_bytes_per_second"], v["gpu_nvlink_rx_bytes_per_second"] = tx_sum, rx_sum
        return v

    # --- GPM, processes, MIG -----------------------------------------------------------------

    def _gpm(self, dev: Device, gpu_instance: int | None = None) -> dict[str, float]:
        s, lib = self.session, self.session.lib
        key = dev.uuid
        if dev.mig is None and key not in self._gpm_ok:
            support = s.probe(dev, "nvmlGpmQueryDeviceSupport")
            self._gpm_ok[key] = bool(support is not None and support.isSupportedDevice)
        if not self._gpm_ok.get(key, False):
            return {}
        sample = s.call_lib("gpm", "nvmlGpmSampleAlloc")
        if sample is None:
            return {}
        if gpu_instance is None:
            got = s.call(dev, "gpm", "nvmlGpmSampleGet", sample)
        else:
            got = s.call(dev, "gpm", "nvmlGpmMigSampleGet", gpu_instance, sample)
        if got is None:
            s.call_lib("gpm", "nvmlGpmSampleFree", sample)
            return {}
        prev, self._gpm_prev[key] = self._gpm_prev.get(key), sample
        if prev is None:
            return {}
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics = lib.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
        request.sample1, request.sample2 = prev, sample
        for i, metric_id in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = s.call_lib("gpm", "nvmlGpmMetricsGet", request)
        s.call_lib("gpm", "nvmlGpmSampleFree", prev)
        out: dict[str, float] = {}
        if result is not None:
            for i, metric in enumerate(GPM_METRICS.values()):
                m = result.metrics[i]
                if m.nvmlReturn == lib.NVML_SUCCESS:
                    out[metric] = m.value / 100.0
        return out

    def _drop_gpm(self, key: str) -> None:
        sample = self._gpm_prev.pop(key, None)
        if sample is not None:
            self.session.call_lib("gpm", "nvmlGpmSampleFree", sample)

    def _processes(self, dev: Device, labels: Labels, r: _Round, seen: set[int]) -> list[ProcessOwner]:
        procs = self.session.call(dev, "processes", "nvmlDeviceGetComputeRunningProcesses")
        if not procs:
            return []
        owners: list[tuple[float, ProcessOwner]] = []
        for p in procs:
            pid = int(p.pid)
            seen.add(pid)
            owner = self._owners.get(pid)
            if owner is None:
                owner = self._owners[pid] = process_owner(pid, self.proc_root)
            if self.pods is not None:
                owner = self.pods.resolve(owner, [dev.uuid, *(c.uuid for c in dev.children)])
            used = float(p.usedGpuMemory) if p.usedGpuMemory is not None else math.nan
            row_labels = {**labels, "pid": str(pid), **owner.labels()}
            if owner.rank is not None:
                row_labels["rank"] = owner.rank
            if owner.pod_uid:
                row_labels["pod_uid"] = owner.pod_uid
            r.procs.append((row_labels, {"gpu_process_memory_used_bytes": used}))
            owners.append((0.0 if math.isnan(used) else used, owner))
        owners.sort(key=lambda pair: -pair[0])
        return [o for _, o in owners]

    def _read_mig(self, dev: Device, r: _Round) -> None:
        v = self._memory(dev)
        v.pop("gpu_memory_reserved_bytes", None)
        assert dev.mig is not None
        v.update(self._gpm(dev, gpu_instance=dev.mig[0]))
        r.migs.append((self.labels(dev), v))

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        for key in list(self._gpm_prev):
            self._drop_gpm(key)
        self.session.close()


def _field_value(fv: Any) -> float:
    """The value of a ``c_nvmlFieldValue_t`` by its valueType (a C union)."""
    kind = int(fv.valueType)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        kind, "ullVal"
    )
    return float(getattr(fv.value, member))
