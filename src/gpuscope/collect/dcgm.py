"""An existing dcgm-exporter as a source: the ``dcgm`` collector (``--dcgm-url``).

Scrapes the exporter's ``/metrics`` and maps ``DCGM_FI_*`` fields to gpuscope's names and units
(MiB to bytes, mJ to J, µs/ns to s, percent to ratio where ours is a ratio). Both the old field
names and the DCGM 4 renames (clock *event* reasons and their violation times) are accepted, and
the labels ``UUID``/``uuid`` and ``Hostname``/``hostname`` in either spelling. Kubernetes labels
(``pod``, ``container``, ``namespace``) become attribution labels. ``DCGM_FI_DEV_XID_ERRORS``
holds the last XID, so a change of it becomes an ``xid`` event. Samples that name no GPU, and
fields with no gpuscope name, are counted (``unplaced``, ``unmapped``), not guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import httpx

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.nvml import REASON_FLAGS, frame
from gpuscope.collect.promtext import ExpositionError, Sample, parse_exposition
from gpuscope.model import Event, Labels
from gpuscope.signals import GPU_METRICS

MIB = 1024.0 * 1024.0

#: DCGM field -> (gpuscope metric, factor to gpuscope units)
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_percent", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_utilization_percent", 1.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("gpu_memory_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("gpu_memory_reserved_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("gpu_memory_total_bytes", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temp_celsius", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temp_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_joules_total", 1e-3),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_memory_clock_mhz", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gpu_clock_event_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gpu_clock_event_reasons", 1.0),
    "DCGM_FI_DEV_POWER_VIOLATION": ("gpu_violation_power_seconds_total", 1e-6),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("gpu_violation_thermal_seconds_total", 1e-6),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS": ("gpu_violation_power_seconds_total", 1e-9),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERMAL_NS": ("gpu_violation_thermal_seconds_total", 1e-9),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("gpu_ecc_sbe_volatile_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu_ecc_dbe_volatile_total", 1.0),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("gpu_ecc_sbe_aggregate_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("gpu_ecc_dbe_aggregate_total", 1.0),
    "DCGM_FI_DEV_RETIRED_SBE": ("gpu_retired_pages_sbe", 1.0),
    "DCGM_FI_DEV_RETIRED_DBE": ("gpu_retired_pages_dbe", 1.0),
    "DCGM_FI_DEV_RETIRED_PENDING": ("gpu_retired_pages_pending", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_correctable", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_uncorrectable", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gpu_remapped_rows_pending", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_remapped_rows_failure", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpu_pcie_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpu_pcie_rx_bytes_per_second", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_total", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gpu_nvlink_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gpu_nvlink_rx_bytes_per_second", 1.0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("gpu_nvlink_replay_errors_total", 1.0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("gpu_nvlink_recovery_errors_total", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpu_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpu_sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_active_ratio", 1.0),
}
#: Fields summed into one gpuscope counter (CRC errors of flits and of data).
SUMMED: dict[str, str] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "gpu_nvlink_crc_errors_total",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "gpu_nvlink_crc_errors_total",
}
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
ATTRIBUTION = ("pod", "container", "namespace")


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        if labels.get(n):
            return labels[n]
    return None


@dataclass(slots=True)
class DcgmGpu:
    """One GPU (or MIG instance) as the exporter reports it."""

    labels: Labels
    hostname: str | None
    values: dict[str, float] = field(default_factory=dict)
    xid: float | None = None


@dataclass(slots=True)
class DcgmReading:
    gpus: dict[tuple[str, str, str], DcgmGpu] = field(default_factory=dict)
    unplaced: int = 0
    unmapped: int = 0


def map_samples(samples: list[Sample], node: str) -> DcgmReading:
    """Group ``DCGM_FI_*`` samples by GPU and translate them; see the module docstring."""
    out = DcgmReading()
    for s in samples:
        known = s.name in FIELDS or s.name in SUMMED or s.name == XID_FIELD
        if not known:
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
            labels.update({k: s.labels[k] for k in ATTRIBUTION if s.labels.get(k)})
            g = out.gpus[(gpu, uuid, mig)] = DcgmGpu(labels, _label(s.labels, "Hostname", "hostname"))
        if s.name == XID_FIELD:
            g.xid = s.value
        elif s.name in SUMMED:
            metric = SUMMED[s.name]
            g.values[metric] = g.values.get(metric, 0.0) + s.value
        else:
            metric, factor = FIELDS[s.name]
            g.values[metric] = s.value * factor
    for g in out.gpus.values():
        mask = g.values.get("gpu_clock_event_reasons")
        if mask is not None and 0 <= mask < 2**64:  # a bit mask; NaN or Inf says nothing
            for bit, flag in REASON_FLAGS:
                g.values[flag] = 1.0 if int(mask) & bit else 0.0
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
        self._client: httpx.Client | None = None
        self._timeout = timeout
        self._fetch = fetch or self._http_get
        self._last_xid: dict[tuple[str, str, str], float] = {}
        self.unplaced = self.unmapped = 0

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root, url=str(ctx.options["dcgm_url"]))

    def _http_get(self) -> str:
        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout)
        resp = self._client.get(self.url)
        resp.raise_for_status()
        return resp.text

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
            if g.xid is None:
                continue
            before = self._last_xid.get(key)
            self._last_xid[key] = g.xid
            if before is not None and g.xid != before and 0 < g.xid < 2**31:
                out.events.append(Event(now, "xid", dict(g.labels), {"code": int(g.xid), "source": "dcgm"}))
        f = frame(now, GPU_METRICS, [(g.labels, g.values) for g in reading.gpus.values() if g.values])
        if f is not None:
            out.frames.append(f)
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
