"""The seam between the simulator and the fake NVML: simulated telemetry becomes NVML state.

A simulated node produces frames in gpuscope's names and units; :func:`apply_frame` writes each
GPU row into a :class:`~gpuscope.collect.fake_nvml.FakeGpu` in NVML's units, so the real
``nvml`` collector reads the simulated GPUs through the same calls it makes on a real node.
Rates NVML only gives as cumulative counters (NVLink throughput) are integrated over the
frame's ``dt``. Events the simulator emits (XIDs, uncorrectable ECC errors, lost GPUs) map to
:meth:`FakeNvml.xid`, :meth:`FakeNvml.ecc_errors` and :meth:`FakeNvml.lose` through
:func:`apply_event`.
"""

from __future__ import annotations

import math

from gpuscope.collect.fake_nvml import FakeGpu, FakeNvml
from gpuscope.model import Event, Frame

#: gpuscope metric -> (FakeGpu attribute, factor from our unit to NVML's)
SCALAR = {
    "gpu_utilization_percent": ("util_gpu", 1.0),
    "gpu_memory_utilization_percent": ("util_mem", 1.0),
    "gpu_memory_used_bytes": ("used", 1.0),
    "gpu_memory_reserved_bytes": ("reserved", 1.0),
    "gpu_memory_total_bytes": ("total", 1.0),
    "gpu_temp_celsius": ("temp", 1.0),
    "gpu_memory_temp_celsius": ("mem_temp", 1.0),
    "gpu_power_watts": ("power_mw", 1000.0),
    "gpu_power_limit_watts": ("limit_mw", 1000.0),
    "gpu_energy_joules_total": ("energy_mj", 1000.0),
    "gpu_sm_clock_mhz": ("sm_clock", 1.0),
    "gpu_memory_clock_mhz": ("mem_clock", 1.0),
    "gpu_clock_event_reasons": ("reasons", 1.0),
    "gpu_pcie_tx_bytes_per_second": ("pcie_tx_kbps", 1 / 1024),
    "gpu_pcie_rx_bytes_per_second": ("pcie_rx_kbps", 1 / 1024),
    "gpu_pcie_replay_total": ("pcie_replay", 1.0),
}
ECC = {
    "gpu_ecc_sbe_volatile_total": (0, 0),
    "gpu_ecc_dbe_volatile_total": (1, 0),
    "gpu_ecc_sbe_aggregate_total": (0, 1),
    "gpu_ecc_dbe_aggregate_total": (1, 1),
}
GPM = {
    "gpu_sm_active_ratio": 2,
    "gpu_sm_occupancy_ratio": 3,
    "gpu_tensor_active_ratio": 5,
    "gpu_dram_active_ratio": 10,
}
RETIRED = {"gpu_retired_pages_sbe": 0, "gpu_retired_pages_dbe": 1}  # metric -> retirement cause
NVLINK_COUNTERS = (
    ("gpu_nvlink_crc_errors_total", "crc_flit"),
    ("gpu_nvlink_replay_errors_total", "replay"),
    ("gpu_nvlink_recovery_errors_total", "recovery"),
)
NVLINK_THROUGHPUT = (
    ("gpu_nvlink_tx_bytes_per_second", "tx_kib"),
    ("gpu_nvlink_rx_bytes_per_second", "rx_kib"),
)
REMAPPED = (
    "gpu_remapped_rows_correctable",
    "gpu_remapped_rows_uncorrectable",
    "gpu_remapped_rows_pending",
    "gpu_remapped_rows_failure",
)


def apply_row(gpu: FakeGpu, row: dict[str, float], dt: float | None = None) -> None:
    """Set one GPU's NVML state from a row of gpuscope metrics (NaN or absent: left as it is).

    ``dt``: seconds the row's rates held for, to advance NVML's cumulative NVLink byte counters;
    None leaves them as they are.
    """
    have = {k: v for k, v in row.items() if not math.isnan(v)}
    for metric, (attr, factor) in SCALAR.items():
        if metric in have:
            setattr(gpu, attr, round(have[metric] * factor))
    for metric, key in ECC.items():
        if metric in have:
            gpu.ecc[key] = int(have[metric])
    if gpu.gpm is not None:
        for metric, metric_id in GPM.items():
            if metric in have:
                gpu.gpm[metric_id] = have[metric] * 100.0
    if all(m in have for m in REMAPPED):
        c, u, p, f = (int(have[m]) for m in REMAPPED)
        gpu.remapped = (c, u, p, f)
    for metric, cause in RETIRED.items():
        if metric in have:
            gpu.retired[cause] = [0x1000 * (k + 1) for k in range(int(have[metric]))]
    if "gpu_retired_pages_pending" in have:
        gpu.retired_pending = have["gpu_retired_pages_pending"] > 0.5
    if "gpu_violation_power_seconds_total" in have:
        gpu.violation_ns[0] = int(have["gpu_violation_power_seconds_total"] * 1e9)
    if "gpu_violation_thermal_seconds_total" in have:
        gpu.violation_ns[1] = int(have["gpu_violation_thermal_seconds_total"] * 1e9)
    if "gpu_memory_free_bytes" in have and "gpu_memory_used_bytes" not in have:
        gpu.used = gpu.total - gpu.reserved - int(have["gpu_memory_free_bytes"])
    if gpu.links:
        _apply_links(gpu, have, dt)


def _apply_links(gpu: FakeGpu, have: dict[str, float], dt: float | None) -> None:
    """GPU-wide NVLink totals spread over the links (remainders to the first ones); throughput
    integrated over ``dt`` into the cumulative byte counters."""
    for metric, attr in NVLINK_COUNTERS:
        if metric in have:
            for i, link in enumerate(gpu.links):
                total = int(have[metric])
                setattr(link, attr, total // len(gpu.links) + (1 if i < total % len(gpu.links) else 0))
    if "gpu_nvlink_links_down" in have:
        down = int(have["gpu_nvlink_links_down"])
        for i, link in enumerate(gpu.links):
            link.active = i >= down
    if dt is not None and dt > 0:
        for metric, attr in NVLINK_THROUGHPUT:
            if metric in have:
                per_link = round(have[metric] * dt / 1024 / len(gpu.links))
                for link in gpu.links:
                    setattr(link, attr, getattr(link, attr) + per_link)


def apply_frame(
    fake: FakeNvml, frame: Frame, index_of: dict[str, int] | None = None, dt: float | None = None
) -> int:
    """Write a frame's GPU rows into ``fake`` (``dt`` as in :func:`apply_row`); returns how many
    rows found a GPU."""
    applied = 0
    for i, labels in enumerate(frame.entities):
        gpu_label = labels.get("gpu")
        if gpu_label is None or "mig" in labels:
            continue
        index = index_of.get(gpu_label) if index_of is not None else int(gpu_label)
        if index is None or not 0 <= index < len(fake.gpus):
            continue
        row = {m: float(frame.values[i, j]) for j, m in enumerate(frame.metrics)}
        apply_row(fake.gpus[index], row, dt)
        applied += 1
    return applied


#: Event kinds :func:`apply_event` turns into NVML state (NVML itself reports them).
NVML_EVENT_KINDS = frozenset({"xid", "ecc_dbe", "gpu_lost"})


def apply_event(fake: FakeNvml, event: Event) -> bool:
    """An ``xid``, ``ecc_dbe`` or ``gpu_lost`` event of the simulator as NVML state; False for
    other kinds or a GPU ``fake`` lacks."""
    gpu = event.labels.get("gpu")
    if gpu is None or not gpu.isdigit() or int(gpu) >= len(fake.gpus):
        return False
    if event.kind == "xid" and "code" in event.data:
        fake.xid(int(gpu), int(event.data["code"]))
        return True
    if event.kind == "ecc_dbe":
        count = event.data.get("count", 1)
        fake.ecc_errors(int(gpu), uncorrected=max(1, int(count) if isinstance(count, int | float) else 1))
        return True
    if event.kind == "gpu_lost":
        fake.lose(int(gpu))
        return True
    return False
