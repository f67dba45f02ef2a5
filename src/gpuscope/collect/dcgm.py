"""An existing dcgm-exporter as a source: the ``dcgm`` collector (``--dcgm-url``).

Scrapes the exporter's ``/metrics`` and maps ``DCGM_FI_*`` fields to gpuscope's names and units
(MiB to bytes, mJ to J, ns to s, KiB to bytes). Names follow the upstream files:

* NVIDIA/dcgm-exporter ``etc/default-counters.csv`` and the label template of
  ``internal/pkg/rendermetrics/render_metrics.go`` at d5e5f510a1b6b393f39a43293ccd9dc985defc79;
* NVIDIA/DCGM ``dcgmlib/dcgm_fields.h`` at 72fa3feaa67d716a75323a8f47c34ff3ee73f824 (DCGM 4.6.0):
  its "renamed per DCGM Field Naming Standard" block gives the canonical names that go-dcgm
  already resolves (``DCGM_FI_DEV_BOARD_POWER_WATTS`` for ``DCGM_FI_DEV_POWER_USAGE``, ...); both
  spellings are read.

Each gpuscope metric lists its fields in order of preference; the first one present on the page
wins, so a page with both ``POWER_USAGE`` and ``POWER_USAGE_INSTANT`` gives the averaged value
whatever the line order.

The exporter repeats a GPU's series once per pod (Kubernetes time-slicing, per-process metrics)
or per Slurm job (``hpc_job``). Device values come from the series without owner labels (or,
when every series has one, from one copy: the copies repeat the device value); each owner becomes
a row of ``gpu_owner_*`` with an ``owner`` label, and the GPU row carries the owner's labels only
when it has exactly one owner. ``pci_bus_id``, model, driver and VBIOS labels are kept in
:attr:`DcgmGpu.info` and go with XID events, so they join kernel-log XIDs by PCI address.

XIDs: ``DCGM_EXP_XID_ERRORS_COUNT{xid=...}`` (the exporter's count per code over its window) is
used when present: a rise is that many new XIDs of that code, a repeat included. Otherwise
``DCGM_FI_DEV_XID_ERRORS`` (the last XID) is watched; a non-zero value at the first scrape is
reported once (flagged ``at_start``), since the agent cannot tell how old it is. Samples that name
no GPU, and fields with no gpuscope name, are counted (``unplaced``, ``unmapped``), not guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.httptext import HttpText
from gpuscope.collect.kmsg import normalise_pci
from gpuscope.collect.nvml import REASON_FLAGS, frame
from gpuscope.collect.promtext import ExpositionError, Sample, parse_exposition
from gpuscope.identity import pod_key
from gpuscope.model import Event, Labels
from gpuscope.signals import DETAIL_METRICS, GPU_EXTRA_METRICS, GPU_METRICS

MIB = 1024.0 * 1024.0
NS = 1e-9  # dcgm_fields.h: "Power Violation time in ns", "... in ns" for every *_VIOLATION and *_NS field

#: gpuscope metric -> DCGM fields (legacy name, then the DCGM 4.6 canonical name) in order of
#: preference, each with its factor to gpuscope units.
CANDIDATES: dict[str, tuple[tuple[str, float], ...]] = {
    "gpu_utilization_percent": (("DCGM_FI_DEV_GPU_UTIL", 1.0), ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0)),
    "gpu_memory_utilization_percent": (("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),),
    "gpu_memory_used_bytes": (("DCGM_FI_DEV_FB_USED", MIB),),
    "gpu_memory_free_bytes": (("DCGM_FI_DEV_FB_FREE", MIB),),
    "gpu_memory_reserved_bytes": (("DCGM_FI_DEV_FB_RESERVED", MIB),),
    "gpu_memory_total_bytes": (("DCGM_FI_DEV_FB_TOTAL", MIB),),
    "gpu_temp_celsius": (("DCGM_FI_DEV_GPU_TEMP", 1.0), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0)),
    "gpu_memory_temp_celsius": (("DCGM_FI_DEV_MEMORY_TEMP", 1.0), ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1.0)),
    "gpu_power_watts": (
        ("DCGM_FI_DEV_POWER_USAGE", 1.0),
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
        ("DCGM_FI_DEV_POWER_USAGE_INSTANT", 1.0),
        ("DCGM_FI_DEV_BOARD_POWER_RAW_WATTS", 1.0),
    ),
    "gpu_power_limit_watts": (
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1.0),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", 1.0),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1.0),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", 1.0),
    ),
    "gpu_energy_joules_total": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),),
    "gpu_sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", 1.0),),
    "gpu_memory_clock_mhz": (("DCGM_FI_DEV_MEM_CLOCK", 1.0),),
    "gpu_clock_event_reasons": (
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
    ),
    "gpu_violation_power_seconds_total": (
        ("DCGM_FI_DEV_POWER_VIOLATION", NS),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", NS),
    ),
    "gpu_violation_thermal_seconds_total": (
        ("DCGM_FI_DEV_THERMAL_VIOLATION", NS),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", NS),
    ),
    "gpu_violation_hw_thermal_seconds_total": (("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", NS),),
    "gpu_violation_hw_power_brake_seconds_total": (
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", NS),
    ),
    "gpu_ecc_sbe_volatile_total": (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0),),
    "gpu_ecc_dbe_volatile_total": (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),),
    "gpu_ecc_sbe_aggregate_total": (("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0),),
    "gpu_ecc_dbe_aggregate_total": (("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0),),
    "gpu_retired_pages_sbe": (("DCGM_FI_DEV_RETIRED_SBE", 1.0), ("DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL", 1.0)),
    "gpu_retired_pages_dbe": (("DCGM_FI_DEV_RETIRED_DBE", 1.0), ("DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL", 1.0)),
    "gpu_retired_pages_pending": (
        ("DCGM_FI_DEV_RETIRED_PENDING", 1.0),
        ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", 1.0),
    ),
    "gpu_remapped_rows_correctable": (
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 1.0),
    ),
    "gpu_remapped_rows_uncorrectable": (
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 1.0),
    ),
    "gpu_remapped_rows_pending": (("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0),),
    "gpu_remapped_rows_failure": (
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", 1.0),
    ),
    "gpu_pcie_tx_bytes_per_second": (("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0),),
    "gpu_pcie_rx_bytes_per_second": (("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0),),
    "gpu_pcie_replay_total": (
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0),
    ),
    "gpu_nvlink_tx_bytes_per_second": (("DCGM_FI_PROF_NVLINK_TX_BYTES", 1.0),),
    "gpu_nvlink_rx_bytes_per_second": (("DCGM_FI_PROF_NVLINK_RX_BYTES", 1.0),),
    "gpu_nvlink_replay_errors_total": (
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 1.0),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", 1.0),
    ),
    "gpu_nvlink_recovery_errors_total": (
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 1.0),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", 1.0),
    ),
    # DCGM sums NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX + _TX, cumulative KiB
    # (DCGM dcgmlib/src/DcgmCacheManager.cpp ReadAndCacheNvLinkBandwidth at 72fa3fe).
    "gpu_nvlink_data_bytes_total": (
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 1024.0),
        ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 1024.0),
    ),
    "gpu_sm_active_ratio": (("DCGM_FI_PROF_SM_ACTIVE", 1.0), ("DCGM_FI_PROF_SM_UTIL_RATIO", 1.0)),
    "gpu_sm_occupancy_ratio": (("DCGM_FI_PROF_SM_OCCUPANCY", 1.0), ("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", 1.0)),
    "gpu_tensor_active_ratio": (
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0),
        ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0),
    ),
    "gpu_dram_active_ratio": (("DCGM_FI_PROF_DRAM_ACTIVE", 1.0), ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0)),
    "gpu_gr_engine_active_ratio": (
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
        ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0),
    ),
    "gpu_encoder_utilization_percent": (("DCGM_FI_DEV_ENC_UTIL", 1.0),),
    "gpu_decoder_utilization_percent": (("DCGM_FI_DEV_DEC_UTIL", 1.0),),
}
#: Fields summed into one gpuscope counter (CRC errors of flits and of data), both spellings.
SUMMED: dict[str, tuple[tuple[str, ...], ...]] = {
    "gpu_nvlink_crc_errors_total": (
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"),
    ),
}
XID_FIELDS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR")
#: dcgm-exporter internal/pkg/counters/const.go DCGMExpXIDErrorsCount (label ``xid``)
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
KNOWN: frozenset[str] = frozenset(
    {f for fields in CANDIDATES.values() for f, _ in fields}
    | {f for groups in SUMMED.values() for names in groups for f in names}
    | {*XID_FIELDS, XID_COUNT}
)
#: owner label -> gpuscope attribution label; dcgm-exporter internal/pkg/transformation/const.go at
#: d5e5f51 (``pod``/``namespace``/``container``, the old ``pod_name``/``pod_namespace``/
#: ``container_name`` of --use-old-namespace, and ``hpc_job`` of the Slurm job mapping).
OWNER_LABELS: dict[str, str] = {
    "pod": "pod",
    "pod_name": "pod",
    "namespace": "namespace",
    "pod_namespace": "namespace",
    "container": "container",
    "container_name": "container",
    "hpc_job": "job",
}
#: GPU description labels of the exporter's template (and label-type counters) -> info keys.
INFO_LABELS: dict[str, str] = {
    "pci_bus_id": "pci_bus_id",
    "modelName": "model",
    "model_name": "model",
    "DCGM_FI_DRIVER_VERSION": "driver",
    "DCGM_FI_SYSTEM_DRIVER_VERSION": "driver",
    "DCGM_FI_DEV_VBIOS_VERSION": "vbios",
    "DCGM_FI_DEV_SERIAL": "serial",
    "DCGM_FI_DEV_BOARD_SERIAL": "serial",
}
#: Fields whose per-owner copies carry the owner's own share (transformation/const.go:
#: metricGPUUtil, metricFBUsed; process_metrics.go); other copies repeat the device value.
OWNER_SHARE = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_owner_utilization_percent", 1.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_owner_memory_used_bytes", MIB),
}

GpuKey = tuple[str, str, str]


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        if labels.get(n):
            return labels[n]
    return None


def owner_of(labels: dict[str, str]) -> Labels:
    """The attribution labels (job, pod as ``namespace/name``, namespace, container) a series carries;
    empty for the device."""
    out: Labels = {}
    for src, dst in OWNER_LABELS.items():
        if labels.get(src) and dst not in out:
            out[dst] = labels[src]
    if out.get("pod") and out.get("namespace"):
        out["pod"] = pod_key(out["namespace"], out["pod"])
    return out


def owner_key(owner: Labels, labels: dict[str, str]) -> str:
    """One stable id of an owner: the pod UID, else namespace/pod, else the job."""
    if labels.get("pod_uid"):
        return labels["pod_uid"]
    if owner.get("pod"):
        return owner["pod"]
    return owner.get("job", "")


@dataclass(slots=True)
class DcgmGpu:
    """One GPU (or MIG instance) as the exporter reports it."""

    labels: Labels
    hostname: str | None
    values: dict[str, float] = field(default_factory=dict)
    xid: float | None = None
    #: the exporter's ``err_msg`` label of the XID series (gpu_collector.go: its text for the code)
    xid_message: str = ""
    #: {code: count within the exporter's window} from DCGM_EXP_XID_ERRORS_COUNT
    xid_counts: dict[int, float] = field(default_factory=dict)
    #: pci_bus_id (normalised as the kernel log writes it), model, driver, vbios, serial
    info: dict[str, str] = field(default_factory=dict)
    #: owner id -> (attribution labels, {owner metric: value})
    owners: dict[str, tuple[Labels, dict[str, float]]] = field(default_factory=dict)
    #: field -> (device value, or None when only owner copies were seen; values of the copies)
    raw: dict[str, tuple[float | None, list[float]]] = field(default_factory=dict)


@dataclass(slots=True)
class DcgmReading:
    gpus: dict[GpuKey, DcgmGpu] = field(default_factory=dict)
    unplaced: int = 0
    unmapped: int = 0


def _info(labels: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for src, dst in INFO_LABELS.items():
        if labels.get(src) and dst not in out:
            out[dst] = labels[src]
    if "pci_bus_id" in out:
        try:
            out["pci_bus_id"] = normalise_pci(out["pci_bus_id"])
        except ValueError:
            del out["pci_bus_id"]  # keep the rest; a malformed address joins nothing
    return out


def _field_value(g: DcgmGpu, name: str) -> float | None:
    got = g.raw.get(name)
    if got is None:
        return None
    device, copies = got
    # every series names an owner: the copies repeat the device value (hpc.go copies each series
    # per job; kubernetes.go without per-process metrics labels the device series per pod)
    return device if device is not None else copies[0]


def _resolve(g: DcgmGpu) -> None:
    for metric, fields in CANDIDATES.items():
        for name, factor in fields:
            v = _field_value(g, name)
            if v is not None:
                g.values[metric] = v * factor
                break
    for metric, groups in SUMMED.items():
        parts = [next((v for n in names if (v := _field_value(g, n)) is not None), None) for names in groups]
        present = [p for p in parts if p is not None]
        if present:
            g.values[metric] = sum(present)
    if "gpu_utilization_percent" not in g.values and "gpu_gr_engine_active_ratio" in g.values:
        # MIG instances have no GPU_UTIL; graphics-engine activity is DCGM's utilization there
        g.values["gpu_utilization_percent"] = 100.0 * g.values["gpu_gr_engine_active_ratio"]
    mask = g.values.get("gpu_clock_event_reasons")
    if mask is not None and 0 <= mask < 2**64:  # a bit mask; NaN or Inf says nothing
        for bit, flag in REASON_FLAGS:
            g.values[flag] = 1.0 if int(mask) & bit else 0.0
    for name, (metric, _) in OWNER_SHARE.items():
        if name in g.raw and g.raw[name][0] is None:  # the copies repeat the device, no share
            for _, ovalues in g.owners.values():
                ovalues.pop(metric, None)
    if len(g.owners) == 1:
        ((labels, _),) = g.owners.values()
        g.labels.update(labels)


def map_samples(samples: list[Sample], node: str) -> DcgmReading:
    """Group ``DCGM_*`` samples by GPU and translate them; see the module docstring."""
    out = DcgmReading()
    for s in samples:
        if s.name not in KNOWN:
            out.unmapped += s.name.startswith("DCGM_")
            continue
        gpu = _label(s.labels, "gpu")
        if gpu is None:
            out.unplaced += 1
            continue
        uuid = _label(s.labels, "UUID", "uuid") or ""
        mig = _label(s.labels, "GPU_I_ID", "gpu_i_id") or ""
        g = out.gpus.get((gpu, uuid, mig))
        if g is None:
            labels = {"node": node, "gpu": gpu}
            if uuid:
                labels["uuid"] = uuid
            if mig:
                labels["mig"] = mig
            g = out.gpus[(gpu, uuid, mig)] = DcgmGpu(labels, _label(s.labels, "Hostname", "hostname"))
        for k, v in _info(s.labels).items():
            g.info.setdefault(k, v)
        if s.name == XID_COUNT:
            code = s.labels.get("xid", "")
            if code.isdecimal():
                g.xid_counts[int(code)] = g.xid_counts.get(int(code), 0.0) + s.value
            continue
        owner = owner_of(s.labels)
        if s.name in XID_FIELDS:
            if not owner or g.xid is None:
                g.xid = s.value
                g.xid_message = s.labels.get("err_msg", "")
            continue
        device, copies = g.raw.get(s.name, (None, []))
        if owner:
            oid = owner_key(owner, s.labels)
            _, ovalues = g.owners.setdefault(oid, (owner, {"gpu_owner_allocated": 1.0}))
            if s.name in OWNER_SHARE:
                metric, factor = OWNER_SHARE[s.name]
                ovalues[metric] = s.value * factor
            copies.append(s.value)
        else:
            device = s.value
        g.raw[s.name] = (device, copies)
    for g in out.gpus.values():
        _resolve(g)
    return out


@register_collector
class DcgmCollector(Collector):
    """GPU telemetry scraped from a running dcgm-exporter."""

    name = "dcgm"
    enabled_by = ("dcgm_url",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        url: str = "http://127.0.0.1:9400/metrics",
        timeout: float = 2.0,
        fetch: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.url = url
        self._http = HttpText(timeout)
        self._fetch = fetch or self._http_get
        self._last_xid: dict[GpuKey, float] = {}
        self._last_counts: dict[GpuKey, dict[int, float]] = {}
        self.unplaced = self.unmapped = 0

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root, url=str(ctx.options["dcgm_url"]))

    def _http_get(self) -> str:
        return self._http.get(self.url)

    def _xid_events(self, now: float, key: GpuKey, g: DcgmGpu) -> list[Event]:
        data_base: dict[str, object] = {"source": "dcgm"}
        if "pci_bus_id" in g.info:
            data_base["pci"] = g.info["pci_bus_id"]
        out: list[Event] = []
        if g.xid_counts:
            before = self._last_counts.get(key)
            self._last_counts[key] = dict(g.xid_counts)
            for code, count in sorted(g.xid_counts.items()):
                prev = 0.0 if before is None else before.get(code, 0.0)
                new = int(count - prev) if count > prev and count < 2**31 else 0
                for _ in range(min(new, 64)):  # a storm is one alert anyway; bound the events
                    data = {**data_base, "code": code}
                    if before is None:
                        data["at_start"] = True
                    out.append(Event(now, "xid", dict(g.labels), data))
            return out
        if g.xid is None:
            return out
        before_xid = self._last_xid.get(key)
        self._last_xid[key] = g.xid
        if g.xid != before_xid and 0 < g.xid < 2**31 and g.xid.is_integer():
            data = {**data_base, "code": int(g.xid)}
            if g.xid_message:
                data["message"] = g.xid_message
            if before_xid is None:
                data["at_start"] = True
            out.append(Event(now, "xid", dict(g.labels), data))
        return out

    def collect(self, now: float) -> Collected:
        text = self._fetch()
        out = Collected()
        try:
            reading = map_samples(parse_exposition(text), self.node)
        except ExpositionError as exc:
            out.errors.append(CollectorError("dcgm_format", f"{self.url}: {exc}"))
            return out
        self.unplaced += reading.unplaced
        self.unmapped += reading.unmapped
        if reading.unplaced:
            out.errors.append(
                CollectorError("dcgm_unplaced", f"{reading.unplaced} DCGM samples name no GPU; not used")
            )
        for key, g in reading.gpus.items():
            out.events.extend(self._xid_events(now, key, g))
        rows = [(g.labels, g.values) for g in reading.gpus.values() if g.values]
        owners = [
            (
                {
                    **{k: v for k, v in g.labels.items() if k in ("node", "gpu", "uuid", "mig")},
                    **labels,
                    "owner": oid,
                },
                vals,
            )
            for g in reading.gpus.values()
            if len(g.owners) > 1
            for oid, (labels, vals) in g.owners.items()
        ]
        for f in (
            frame(now, (*GPU_METRICS, *GPU_EXTRA_METRICS), rows),
            frame(now, DETAIL_METRICS, owners),
        ):
            if f is not None:
                out.frames.append(f)
        return out

    def close(self) -> None:
        self._http.close()
