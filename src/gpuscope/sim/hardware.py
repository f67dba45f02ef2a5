"""GPU models the simulator knows, and what the driver says for each XID code.

Levels come from real captures: an H100 80GB HBM3 idles at 70 W, 345 MHz, 0 MiB used of
81,559 MiB and reports GpuIdle (0x1); under load it draws 632 W of 700 W at 1,980 MHz SM and
2,619 MHz memory clock, 59 °C die and 54 °C HBM (nvidia_gpu_exporter captures, driver 590).
A100 levels follow AcmeTrace (60 W idle of 400 W, busy 395-440 W).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
GIB = 1024 * MIB

#: NVML clock event reason bits (nvml.h ``nvmlClocksEventReason*``)
REASON_IDLE = 0x1
REASON_SW_POWER = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_bytes: float
    power_limit_watts: float
    idle_watts: float
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    memory_clock_mhz: float
    max_operating_temp: float  # software thermal slowdown above this
    slowdown_temp: float  # hardware thermal slowdown above this
    nvlink: bool
    row_remapping: bool  # Ampere and later remap rows; older parts retire pages


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("H100-SXM5-80GB", 81559 * MIB, 700.0, 70.0, 1980.0, 345.0, 2619.0, 87.0, 91.0, True, True),
        GpuModel("H100-PCIe-80GB", 81559 * MIB, 350.0, 48.0, 1755.0, 345.0, 1593.0, 87.0, 91.0, False, True),
        GpuModel("H200-SXM-141GB", 143771 * MIB, 700.0, 78.0, 1980.0, 345.0, 3201.0, 87.0, 91.0, True, True),
        GpuModel("A100-SXM4-80GB", 81920 * MIB, 400.0, 60.0, 1410.0, 210.0, 1593.0, 85.0, 90.0, True, True),
        GpuModel("A100-SXM4-40GB", 40960 * MIB, 400.0, 55.0, 1410.0, 210.0, 1215.0, 85.0, 90.0, True, True),
        GpuModel("L40S-48GB", 46068 * MIB, 350.0, 35.0, 2520.0, 210.0, 9001.0, 88.0, 92.0, False, True),
        GpuModel("B200-180GB", 183359 * MIB, 1000.0, 140.0, 1965.0, 345.0, 3996.0, 87.0, 91.0, True, True),
        GpuModel("V100-SXM2-32GB", 32768 * MIB, 300.0, 40.0, 1530.0, 135.0, 877.0, 83.0, 88.0, True, False),
    )
}

#: what the driver logs for the XIDs the simulator emits (NVIDIA XID catalog, abridged)
XID_MESSAGES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault (MMU fault)",
    43: "GPU stopped processing (channel reset after a user-space error)",
    45: "Preemptive cleanup, due to previous errors",
    48: "An uncorrectable double bit error (DBE) has been detected on the GPU",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "Timeout waiting for the GSP to respond",
    120: "GSP error",
}

#: fatal XIDs after which the process on the GPU survives (they need a reset, not a restart)
XID_PROCESS_SURVIVES: frozenset[int] = frozenset({63, 92})


def xid_message(code: int) -> str:
    return XID_MESSAGES.get(code, f"Xid {code}")
