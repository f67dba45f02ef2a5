"""GPU and node faults: driver errors, memory errors, heat, power, links, nodes going dark."""

from __future__ import annotations

import math

from gpuscope.model import Event
from gpuscope.signals import APP_XIDS, FATAL_XIDS
from gpuscope.sim.faults.base import Effect, register
from gpuscope.sim.hardware import XID_PROCESS_SURVIVES, xid_message
from gpuscope.sim.scenario import FaultSpec
from gpuscope.sim.world import World


class _GpuEffect(Effect):
    def node_event(self, t: float, kind: str, data: dict[str, object]) -> None:
        node = self.fault.node
        assert node is not None, "GPU faults target a node"
        self.world.node_event(node, Event(t, kind, {"node": node, "gpu": str(self.fault.gpu)}, data))


@register
class Xid(_GpuEffect):
    """An XID from the driver. 79: the GPU falls off the bus and disappears; other fatal codes kill
    the process and leave the GPU unusable until reset (48 also counts a DBE); application codes
    (13, 31, 43, 45, 68) are only logged, the process survives."""

    kinds = ("xid",)

    @property
    def code(self) -> int:
        return int(self.fault.params["code"])

    def begin(self, t: float) -> None:
        code, i = self.code, self.gpu_index
        self.node_event(t, "xid", {"code": code, "message": xid_message(code)})
        if code == 79:
            self.node_event(t, "gpu_lost", {"reason": "GPU has fallen off the bus (Xid 79)"})
        elif code == 48:
            self.world.fleet.record_dbe(i, 1)
            self.node_event(t, "ecc_dbe", {"count": 1})
        elif code == 63:
            self.world.fleet.rows_pending[i] = 1.0
        elif code == 64:
            self.world.fleet.rows_failure[i] = 1.0
        elif code == 92:
            self.world.fleet.counters[i, [0, 2]] += 500.0
        if self._kills:
            self.world.kill_gpu_process(i, t, self.fault.index, f"CUDA error after Xid {code}")

    @property
    def _kills(self) -> bool:
        return self.code in FATAL_XIDS and self.code not in XID_PROCESS_SURVIVES and self.code not in APP_XIDS

    def apply(self) -> None:
        if self.code == 79:
            self.world.fleet.mods.lost[self.gpu_index] = True
        elif self._kills:
            self.world.fleet.mods.killed[self.gpu_index] = True


@register
class EccDbe(_GpuEffect):
    """An uncorrectable memory error: DBE counters, a remapped row pending, XID 48; the process dies."""

    kinds = ("ecc_dbe",)

    def begin(self, t: float) -> None:
        i, count = self.gpu_index, int(self.fault.params["count"])
        self.world.fleet.record_dbe(i, count)
        self.node_event(t, "ecc_dbe", {"count": count})
        self.node_event(t, "xid", {"code": 48, "message": xid_message(48)})
        self.world.kill_gpu_process(i, t, self.fault.index, "uncorrectable ECC error")

    def apply(self) -> None:
        self.world.fleet.mods.killed[self.gpu_index] = True


@register
class GpuLost(_GpuEffect):
    """NVML reports the GPU lost: it vanishes from the node's frames and its process dies."""

    kinds = ("gpu_lost",)

    def begin(self, t: float) -> None:
        self.node_event(t, "gpu_lost", {"reason": str(self.fault.params["reason"])})
        self.world.kill_gpu_process(self.gpu_index, t, self.fault.index, "GPU lost")

    def apply(self) -> None:
        self.world.fleet.mods.lost[self.gpu_index] = True


@register
class ThermalThrottle(Effect):
    """Cooling fails: the GPU heats towards ``temp``; past its limits clocks drop and flags rise."""

    kinds = ("thermal_throttle",)

    def apply(self) -> None:
        self.world.fleet.mods.temp[self.gpu_index] = self.param("temp")


@register
class PowerThrottle(Effect):
    """A lowered power cap (software slowdown) or an asserted external power brake."""

    kinds = ("power_throttle",)

    def apply(self) -> None:
        mods, i = self.world.fleet.mods, self.gpu_index
        if self.fault.params["mode"] == "brake":
            mods.brake[i] = True
        else:
            mods.power_cap[i] = min(mods.power_cap[i], self.param("cap"))


@register
class GpuSlow(Effect):
    """The GPU runs slower than its peers with no throttle reason (degraded part, bad clocks)."""

    kinds = ("gpu_slow",)

    def apply(self) -> None:
        self.world.fleet.mods.slowdown[self.gpu_index] *= self.param("slowdown")


@register
class NvlinkErrors(Effect):
    """NVLink CRC/replay/recovery errors; replays cost the job's all-reduce some bandwidth."""

    kinds = ("nvlink_errors",)

    def apply(self) -> None:
        mods, i = self.world.fleet.mods, self.gpu_index
        mods.nvlink_rate[i] += self.param("rate")
        mods.links_down[i] = max(mods.links_down[i], self.param("links_down"))
        job = self.world.job_on_gpu(i)
        if job is not None:
            job.cond.comm_factor *= 1.3


@register
class PcieReplay(Effect):
    kinds = ("pcie_replay",)

    def apply(self) -> None:
        self.world.fleet.mods.pcie_rate[self.gpu_index] += self.param("rate")


@register
class EccSbeStorm(Effect):
    kinds = ("ecc_sbe_storm",)

    def apply(self) -> None:
        self.world.fleet.mods.sbe_rate[self.gpu_index] += self.param("rate")


@register
class NetworkDegraded(Effect):
    """Fabric errors and TCP retransmits on a node; jobs with ranks there communicate slower."""

    kinds = ("network_degraded",)

    def apply(self) -> None:
        k, nodes = self.node_index, self.world.nodes
        nodes.retrans_ratio[k] += self.param("retrans_ratio")
        nodes.ib_error_rate[k] += self.param("ib_error_rate")
        node = self.fault.node
        comm = 1.0 + (self.param("slowdown") - 1.0) / 0.15  # the collective is 15 % of a healthy step
        for job in self.world.jobs.values():
            if node in job.spec.nodes:
                job.cond.comm_factor *= comm


@register
class NodeDown(Effect):
    """The node goes dark: no batches, its ranks and replicas die; it reboots when the fault ends."""

    kinds = ("node_down",)

    def begin(self, t: float) -> None:
        k, per = self.node_index, self.world.per_node
        for i in range(k * per, (k + 1) * per):
            self.world.kill_gpu_process(i, t, self.fault.index, f"{self.fault.node} went down")

    def apply(self) -> None:
        self.world.nodes.down[self.node_index] = True


@register
class GpuFailureRisk(_GpuEffect):
    """A GPU wearing out: over ``ramp`` seconds its corrected ECC errors, remapped rows and thermal
    throttle episodes creep up (episodes come more often as it degrades), then a fatal XID
    (``code``) takes it down; it stays unusable until the fault ends (replaced or reset). Each
    symptom can be left out (``sbe_rate: 0``, ``rows: 0``, ``throttle: false``): worn memory shows
    errors and remaps without heat, a failing cooler heat and errors without remaps."""

    kinds = ("gpu_failure_risk",)

    def __init__(self, fault: FaultSpec, world: World) -> None:
        super().__init__(fault, world)
        self.t0 = math.nan
        self.progress = 0.0
        self.sbe = 0.0  # this fault's share of the GPU's corrected-error rate now
        self.rows = 0
        self.next_episode = math.inf
        self.episode_end = -math.inf
        self.dead = False

    def begin(self, t: float) -> None:
        self.t0 = t
        if self.fault.params["throttle"]:
            self.next_episode = t + self._period()

    def _period(self) -> float:
        # a third of the ramp between episodes at first, a twentieth at the end
        return self.param("ramp") * (1.0 / 3.0 - (1.0 / 3.0 - 1.0 / 20.0) * self.progress)

    def advance(self, t: float) -> None:
        if self.dead:
            return
        i, fleet = self.gpu_index, self.world.fleet
        self.progress = min(max((t - self.t0) / self.param("ramp"), 0.0), 1.0)
        sbe = self.param("sbe_rate") * self.progress
        fleet.mods.sbe_rate[i] += sbe - self.sbe
        self.sbe = sbe
        rows = int(self.param("rows") * self.progress)
        fleet.rows_corr[i] += rows - self.rows
        self.rows = rows
        if t >= self.next_episode:
            self.episode_end = t + 90.0
            self.next_episode = t + self._period()
        fleet.mods.temp[i] = self.param("temp") if t < self.episode_end else math.nan
        if self.progress >= 1.0:
            self.dead = True
            code = int(self.param("code"))
            self.node_event(t, "xid", {"code": code, "message": xid_message(code)})
            if code == 79:
                self.node_event(t, "gpu_lost", {"reason": "GPU has fallen off the bus (Xid 79)"})
            self.world.kill_gpu_process(i, t, self.fault.index, f"CUDA error after Xid {code}")
            self.apply()

    def apply(self) -> None:
        mods, i = self.world.fleet.mods, self.gpu_index
        mods.sbe_rate[i] += self.sbe
        if self.dead:
            if int(self.param("code")) == 79:
                mods.lost[i] = True
            else:
                mods.killed[i] = True
