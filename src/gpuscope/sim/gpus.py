"""Per-GPU state and telemetry of the whole simulated cluster, vectorised over GPUs.

Workloads say each tick what they ask of their GPUs (the ``demand`` arrays); faults set the
``mods`` arrays; :meth:`GpuFleet.sample` turns both into one telemetry row per GPU. Physics is
first order on purpose: power follows demand, temperature follows power with a lag, clocks drop
when power or temperature limits bite, and a slower clock makes the rank on that GPU slower
(``perf``), which is how a hot or capped GPU turns into a straggler.

Healthy levels (see :mod:`gpuscope.sim.hardware`): training GPUs at 97-100 % utilisation, SM
activity 0.55-0.85 (AcmeTrace: SM activity median 50 % over all samples, with utilisation at
99 %), 85-95 % of the power limit, 55-68 °C (AcmeTrace busy GPUs 53-69 °C); idle GPUs at idle
power, 28-36 °C.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

import numpy as np

from gpuscope.model import FloatArray
from gpuscope.signals import GPU_METRICS
from gpuscope.sim.hardware import (
    MIB,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_IDLE,
    REASON_SW_POWER,
    REASON_SW_THERMAL,
    GpuModel,
)

GPU_COLUMNS: tuple[str, ...] = tuple(GPU_METRICS)
COL = {name: j for j, name in enumerate(GPU_COLUMNS)}

AMBIENT_C = 27.0
WATT_TO_C = 0.055  # °C per watt: 632 W -> ~62 °C, 70 W idle -> ~31 °C
TEMP_TAU_S = 25.0
DRIVER_RESERVED = 479 * MIB
CONTEXT_BYTES = 512 * MIB

# healthy base rates of the error counters, per GPU per second
SBE_RATE = 2e-6
PCIE_REPLAY_RATE = 2e-5
NVLINK_CRC_RATE = 1e-5

BoolArray = np.ndarray[tuple[int], np.dtype[np.bool_]]
IntArray = np.ndarray[tuple[int], np.dtype[np.int64]]


def gpu_uuid(seed: int, node: str, gpu: int) -> str:
    """A stable, realistic-looking UUID for a simulated GPU."""
    digest = hashlib.sha256(f"{seed}:{node}:{gpu}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=digest)}"


@dataclass(slots=True)
class Demand:
    """What the workloads ask of each GPU this tick (reset to idle before every tick)."""

    util: FloatArray
    sm: FloatArray
    power: FloatArray  # fraction of the power limit
    mem: FloatArray  # bytes
    mem_util: FloatArray
    pcie: FloatArray  # bytes/s
    nvlink: FloatArray  # bytes/s
    active: BoolArray  # a process holds a context on the GPU
    jobs: list[str | None] = field(default_factory=list)


@dataclass(slots=True)
class Mods:
    """Fault conditions in force (recomputed whenever a fault starts or ends)."""

    lost: BoolArray
    killed: BoolArray  # present but unusable until reset (a fatal error killed its process)
    temp: FloatArray  # NaN, or the temperature a cooling fault drives the GPU to
    power_cap: FloatArray  # fraction of the power limit enforced
    brake: BoolArray
    slowdown: FloatArray
    #: the share of ``slowdown`` that is the GPU's normal speed, not a fault (a slower part or a
    #: clock limit the job was placed on): the ground truth judges the GPU against it
    part_slowdown: FloatArray
    sbe_rate: FloatArray
    nvlink_rate: FloatArray
    pcie_rate: FloatArray
    links_down: FloatArray


class GpuFleet:
    """Every GPU of the cluster; index ``i = node_index * gpus_per_node + gpu``."""

    def __init__(
        self, nodes: tuple[str, ...], per_node: int, model: GpuModel, seed: int, rng: np.random.Generator
    ) -> None:
        self.nodes = nodes
        self.per_node = per_node
        self.model = model
        self.rng = rng
        n = self.n = len(nodes) * per_node
        self.node_of = [nodes[i // per_node] for i in range(n)]
        self.uuids = [gpu_uuid(seed, nodes[i // per_node], i % per_node) for i in range(n)]
        self.temp_offset = np.clip(rng.normal(0.0, 2.5, n), -6.0, 6.0)
        self.power_base = rng.uniform(0.85, 0.95, n)
        self.sm_offset = np.clip(rng.normal(0.0, 0.03, n), -0.08, 0.08)
        self.node_up = np.ones(n, dtype=bool)
        self.temp = AMBIENT_C + WATT_TO_C * model.idle_watts + self.temp_offset
        self.energy = rng.uniform(1e8, 5e9, n)
        self.viol_power = np.zeros(n)
        self.viol_thermal = np.zeros(n)
        # counters: sbe_vol, dbe_vol, sbe_agg, dbe_agg, pcie, nvl_crc, nvl_replay, nvl_recovery
        self.counters = np.zeros((n, 8))
        self.counters[:, 2] = np.where(rng.random(n) < 0.15, rng.poisson(6.0, n), 0)
        self.counters[:, 4] = np.where(rng.random(n) < 0.3, rng.poisson(3.0, n), 0)
        self.rows_corr = np.where(rng.random(n) < 0.05, 1.0, 0.0)
        self.rows_uncorr = np.zeros(n)
        self.rows_pending = np.zeros(n)
        self.rows_failure = np.zeros(n)
        self.blip = np.zeros(n)
        self.perf = np.ones(n)
        self.demand = self._idle_demand()
        self.mods = self.neutral_mods()

    # -- conditions -------------------------------------------------------------------------------

    def _idle_demand(self) -> Demand:
        n = self.n
        return Demand(
            util=np.zeros(n),
            sm=np.zeros(n),
            power=np.full(n, self.model.idle_watts / self.model.power_limit_watts),
            mem=np.zeros(n),
            mem_util=np.zeros(n),
            pcie=np.full(n, 2e5),
            nvlink=np.zeros(n),
            active=np.zeros(n, dtype=bool),
            jobs=[None] * n,
        )

    def reset_demand(self) -> Demand:
        self.demand = self._idle_demand()
        return self.demand

    def neutral_mods(self) -> Mods:
        n = self.n
        return Mods(
            lost=np.zeros(n, dtype=bool),
            killed=np.zeros(n, dtype=bool),
            temp=np.full(n, np.nan),
            power_cap=np.ones(n),
            brake=np.zeros(n, dtype=bool),
            slowdown=np.ones(n),
            part_slowdown=np.ones(n),
            sbe_rate=np.zeros(n),
            nvlink_rate=np.zeros(n),
            pcie_rate=np.zeros(n),
            links_down=np.zeros(n),
        )

    @property
    def usable(self) -> BoolArray:
        """GPUs a process can run on: present, on a node that is up, not waiting for a reset."""
        return self.node_up & ~self.mods.lost & ~self.mods.killed

    def reset_gpu(self, i: int) -> None:
        """A GPU reset or reboot: volatile ECC counters and pending remaps clear, energy restarts."""
        self.counters[i, 0:2] = 0.0
        self.rows_pending[i] = 0.0
        self.energy[i] = 0.0
        self.viol_power[i] = 0.0
        self.viol_thermal[i] = 0.0
        self.temp[i] = AMBIENT_C + WATT_TO_C * self.model.idle_watts + self.temp_offset[i]

    def record_dbe(self, i: int, count: int) -> None:
        self.counters[i, 1] += count
        self.counters[i, 3] += count
        if self.model.row_remapping:
            self.rows_uncorr[i] += count
        self.rows_pending[i] = 1.0

    # -- telemetry --------------------------------------------------------------------------------

    def sample(self, dt: float) -> FloatArray:
        """Advance the physics by ``dt`` and return one telemetry row per GPU (``GPU_COLUMNS``)."""
        m, d, mods, rng = self.model, self.demand, self.mods, self.rng
        n = self.n
        z = rng.standard_normal((n, 6))
        limit = m.power_limit_watts
        active = d.active & ~mods.killed
        compute = active & (d.util > 50.0)

        demand_w = np.maximum(d.power * limit * (1.0 + 0.015 * z[:, 0]), m.idle_watts * 0.95)
        target_t = AMBIENT_C + WATT_TO_C * demand_w + self.temp_offset
        hot = ~np.isnan(mods.temp)
        if hot.any():
            target_t = np.where(hot, np.maximum(target_t, np.nan_to_num(mods.temp) + 0.6 * z[:, 1]), target_t)
        self.temp += (target_t - self.temp) * (1.0 - np.exp(-dt / TEMP_TAU_S))
        temp = np.round(self.temp + 0.25 * z[:, 2])  # NVML reports whole degrees; flags follow them

        sw_thermal = temp >= m.max_operating_temp
        hw_thermal = temp >= m.slowdown_temp
        clock = np.ones(n)
        clock = np.where(
            sw_thermal, np.clip(1.0 - 0.07 * (temp - m.max_operating_temp + 1.0), 0.55, 0.95), clock
        )
        clock = np.where(hw_thermal, np.minimum(clock, 0.5), clock)

        cap_w = limit * mods.power_cap
        capped = compute & (demand_w > cap_w)
        clock = np.where(capped, np.minimum(clock, np.sqrt(cap_w / demand_w)), clock)
        clock = np.where(mods.brake & compute, np.minimum(clock, 0.45), clock)
        # healthy life: the software power cap engages for a second or two now and then under load
        start_blip = compute & (self.blip <= 0) & (rng.random(n) < 0.002 * dt) & (d.power > 0.8)
        self.blip = np.where(start_blip, rng.integers(1, 4, n).astype(float), np.maximum(self.blip - dt, 0.0))
        blipping = compute & (self.blip > 0)
        clock = np.where(blipping, np.minimum(clock, 0.985), clock)
        clock = clock / mods.slowdown
        self.perf = np.where(compute, clock, 1.0)

        dyn = np.maximum(demand_w - m.idle_watts, 0.0)
        power = m.idle_watts + dyn * np.where(compute, clock**2, 1.0)
        power = np.where(capped, cap_w * (0.985 + 0.005 * z[:, 3]), power)
        power = np.where(mods.brake & compute, np.minimum(power, 0.42 * limit), power)
        power = np.where(blipping, np.minimum(power, limit * 0.995), power)
        power = np.minimum(power, limit * 0.998)

        sm_clock = np.where(active, np.round(m.max_sm_clock_mhz * clock / 15.0) * 15.0, m.idle_sm_clock_mhz)
        jitter = compute & (z[:, 4] > 2.0)
        sm_clock = np.where(jitter, sm_clock - 15.0, sm_clock)

        sw_power = capped | blipping
        brake = mods.brake & compute
        reasons = (
            np.where(active, 0, REASON_IDLE)
            | np.where(sw_power, REASON_SW_POWER, 0)
            | np.where(hw_thermal | brake, REASON_HW_SLOWDOWN, 0)
            | np.where(sw_thermal, REASON_SW_THERMAL, 0)
            | np.where(hw_thermal, REASON_HW_THERMAL, 0)
            | np.where(brake, REASON_HW_POWER_BRAKE, 0)
        )

        self.energy += power * dt
        self.viol_power += np.where(sw_power | brake, dt, 0.0)
        self.viol_thermal += np.where(sw_thermal | hw_thermal, dt, 0.0)
        rates = np.empty((n, 5))
        rates[:, 0] = SBE_RATE + mods.sbe_rate
        rates[:, 1] = PCIE_REPLAY_RATE + mods.pcie_rate
        rates[:, 2] = NVLINK_CRC_RATE + mods.nvlink_rate
        rates[:, 3] = 0.1 * mods.nvlink_rate
        rates[:, 4] = 0.01 * mods.nvlink_rate
        inc = rng.poisson(rates * dt).astype(float)
        self.counters[:, 0] += inc[:, 0]
        self.counters[:, 2] += inc[:, 0]
        self.counters[:, 4:8] += inc[:, 1:5]

        util = np.where(active, np.clip(np.round(d.util + 1.2 * z[:, 5]), 0.0, 100.0), 0.0)
        sm = d.sm * (1.0 + 0.04 * z[:, 1]) + np.where(d.sm > 0.3, self.sm_offset, 0.0)
        sm = np.where(active, np.clip(sm, 0.005, 1.0), 0.0)
        # memory stays held by a live process even while it runs no kernels
        used = np.where(d.mem > 0, np.minimum(d.mem + CONTEXT_BYTES, m.memory_bytes - DRIVER_RESERVED), 0.0)
        mem_util = np.where(active, np.clip(d.mem_util * (1.0 + 0.05 * z[:, 3]), 0.0, 100.0), 0.0)

        out = np.empty((n, len(GPU_COLUMNS)))
        c = COL
        out[:, c["gpu_utilization_percent"]] = util
        out[:, c["gpu_sm_active_ratio"]] = sm
        out[:, c["gpu_sm_occupancy_ratio"]] = sm * 0.3
        out[:, c["gpu_tensor_active_ratio"]] = sm * 0.55
        out[:, c["gpu_dram_active_ratio"]] = mem_util / 100.0
        out[:, c["gpu_memory_utilization_percent"]] = np.round(mem_util)
        out[:, c["gpu_memory_used_bytes"]] = used
        out[:, c["gpu_memory_free_bytes"]] = m.memory_bytes - DRIVER_RESERVED - used
        out[:, c["gpu_memory_reserved_bytes"]] = DRIVER_RESERVED
        out[:, c["gpu_memory_total_bytes"]] = m.memory_bytes
        out[:, c["gpu_temp_celsius"]] = temp
        out[:, c["gpu_memory_temp_celsius"]] = np.round(0.6 * temp + 22.0 + 0.5 * self.temp_offset)
        out[:, c["gpu_power_watts"]] = np.round(power, 2)
        out[:, c["gpu_power_limit_watts"]] = cap_w
        out[:, c["gpu_energy_joules_total"]] = np.floor(self.energy)
        out[:, c["gpu_sm_clock_mhz"]] = sm_clock
        out[:, c["gpu_memory_clock_mhz"]] = m.memory_clock_mhz
        out[:, c["gpu_clock_event_reasons"]] = reasons
        out[:, c["gpu_throttle_sw_power"]] = sw_power
        out[:, c["gpu_throttle_hw_slowdown"]] = hw_thermal | brake
        out[:, c["gpu_throttle_sw_thermal"]] = sw_thermal
        out[:, c["gpu_throttle_hw_thermal"]] = hw_thermal
        out[:, c["gpu_throttle_hw_power_brake"]] = brake
        out[:, c["gpu_violation_power_seconds_total"]] = self.viol_power
        out[:, c["gpu_violation_thermal_seconds_total"]] = self.viol_thermal
        out[:, c["gpu_ecc_sbe_volatile_total"]] = self.counters[:, 0]
        out[:, c["gpu_ecc_dbe_volatile_total"]] = self.counters[:, 1]
        out[:, c["gpu_ecc_sbe_aggregate_total"]] = self.counters[:, 2]
        out[:, c["gpu_ecc_dbe_aggregate_total"]] = self.counters[:, 3]
        retire = np.nan if m.row_remapping else 0.0
        out[:, c["gpu_retired_pages_sbe"]] = retire
        out[:, c["gpu_retired_pages_dbe"]] = retire if m.row_remapping else self.counters[:, 3]
        out[:, c["gpu_retired_pages_pending"]] = retire if m.row_remapping else self.rows_pending
        remap = 1.0 if m.row_remapping else np.nan
        out[:, c["gpu_remapped_rows_correctable"]] = self.rows_corr * remap
        out[:, c["gpu_remapped_rows_uncorrectable"]] = self.rows_uncorr * remap
        out[:, c["gpu_remapped_rows_pending"]] = self.rows_pending * remap
        out[:, c["gpu_remapped_rows_failure"]] = self.rows_failure * remap
        out[:, c["gpu_pcie_tx_bytes_per_second"]] = d.pcie * (1.0 + 0.05 * np.abs(z[:, 0]))
        out[:, c["gpu_pcie_rx_bytes_per_second"]] = d.pcie * (0.8 + 0.05 * np.abs(z[:, 1]))
        out[:, c["gpu_pcie_replay_total"]] = self.counters[:, 4]
        nvl = 1.0 if m.nvlink else np.nan
        bw = d.nvlink * (1.0 + 0.03 * z[:, 2])
        out[:, c["gpu_nvlink_tx_bytes_per_second"]] = bw * nvl
        out[:, c["gpu_nvlink_rx_bytes_per_second"]] = bw * nvl
        out[:, c["gpu_nvlink_crc_errors_total"]] = self.counters[:, 5] * nvl
        out[:, c["gpu_nvlink_replay_errors_total"]] = self.counters[:, 6] * nvl
        out[:, c["gpu_nvlink_recovery_errors_total"]] = self.counters[:, 7] * nvl
        out[:, c["gpu_nvlink_links_down"]] = mods.links_down * nvl
        return out
