"""A synchronous data-parallel training job, seen from its SDK: steps, losses, checkpoints, beats.

The job moves through ``pending -> running -> ended | failed`` (a failed job may be restarted from
its last good checkpoint when the fault that broke it clears). While running it is in one phase:
``init`` (loading, 10-20 s), ``step`` or ``ckpt``. Progress is continuous: a phase has a planned
duration and a completed fraction, so a fault that starts mid-step slows or freezes the rest of
that step. Every rank finishes step k at the same time, set by the slowest rank's compute time
plus the collective; each rank reports how late it arrived at the collective.

Progress stops while the job hangs (processes alive: heartbeats go on), while its GPUs sit idle,
and while a rank is dead: the survivors block in the next collective until the watchdog
(``collective_timeout``) fails the job.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from gpuscope.model import Event, FloatArray, TrainingRecord
from gpuscope.sim.gpus import Demand, GpuFleet
from gpuscope.sim.nodes import NodeFleet
from gpuscope.sim.scenario import JobSpec

HEARTBEAT_PERIOD = 1.0
COMPUTE_SHARE = 0.85  # of a healthy step; the rest is the gradient all-reduce
IntArray = np.ndarray[tuple[int], np.dtype[np.int64]]
BoolArray = np.ndarray[tuple[int], np.dtype[np.bool_]]


@dataclass(slots=True)
class LossEffect:
    """A fault's hold on the loss curve, fixed at its onset (time and step)."""

    kind: str  # plateau | divergence | spike
    t0: float
    step0: int
    factor: float = 1.0
    decay: float = 1.0
    rate: float = 0.0


@dataclass(slots=True)
class JobConditions:
    """What active faults do to a job; rebuilt whenever a fault starts or ends."""

    rank_slow: FloatArray
    grad: FloatArray
    #: per-rank compute factor of where the job was placed (slower hardware): the job's own
    #: normal, so the ground truth counts it as healthy, unlike ``rank_slow``
    rank_pace: FloatArray
    job_factor: float = 1.0
    comm_factor: float = 1.0
    hang: bool = False
    idle: bool = False
    nan: bool = False
    loss_effects: list[LossEffect] = field(default_factory=list)
    ckpt_fail: tuple[bool, str] | None = None
    ckpt_corrupt: bool = False
    ckpt_stop: bool = False
    frag: dict[int, tuple[float, float]] = field(default_factory=dict)

    @staticmethod
    def neutral(world: int) -> JobConditions:
        return JobConditions(rank_slow=np.ones(world), grad=np.ones(world), rank_pace=np.ones(world))


class TrainingJob:
    def __init__(self, spec: JobSpec, fleet: GpuFleet, nodes: NodeFleet, rng: np.random.Generator) -> None:
        self.spec = spec
        self.fleet = fleet
        self.nodes = nodes
        self.rng = rng
        self.world = spec.world_size
        per = fleet.per_node
        node_pos = {name: k for k, name in enumerate(fleet.nodes)}
        placement = spec.placement
        self.gpu_idx: IntArray = np.array([node_pos[n] * per + g for _, n, g in placement], dtype=np.int64)
        self.node_idx: IntArray = np.array([node_pos[n] for _, n, _ in placement], dtype=np.int64)
        self.rank_nodes = [n for _, n, _ in placement]
        self.beat_labels = [
            {"job": spec.name, "rank": str(r), "node": n, "gpu": str(g)} for r, n, g in placement
        ]
        self.rec_labels = [{"node": n, "gpu": str(g)} for _, n, g in placement]
        self.placement = [[r, n, g] for r, n, g in placement]
        self.multi_node = len(spec.nodes) > 1
        self.total_mem = fleet.model.memory_bytes
        self.sm_base = float(rng.uniform(0.62, 0.8))
        self.frag0 = rng.uniform(0.04, 0.09, self.world)
        self.reserved0 = spec.memory_fraction * self.total_mem
        self.alloc0 = self.reserved0 * (1.0 - self.frag0)
        self.retries = np.zeros(self.world)
        self.ckpt_bytes = round(0.35 * self.reserved0)
        span = spec.end - spec.start
        self.expected_steps = spec.steps or max(10, int(span / spec.step_time))
        self.drop_step = max(1, int(spec.lr_decay_at * self.expected_steps))
        self.hb_phase = float(rng.uniform(0.0, HEARTBEAT_PERIOD))

        self.state = "pending"
        self.alive: BoolArray = np.zeros(self.world, dtype=bool)
        self.cond = JobConditions.neutral(self.world)
        self.step = 0
        self.good_ckpt_step = 0
        self.restarts = 0
        self.breakers: set[int] = set()
        self.events: list[Event] = []
        self.records: list[TrainingRecord] = []
        self._delayed: list[tuple[float, int, Event]] = []
        self._seq = 0
        self.phase = "init"
        self.frac = 0.0
        self.dur = 1.0
        self.seg_start = 0.0
        self.moving = False
        self.step_started = 0.0
        self.last_step_end = 0.0
        self.ckpt_ref = 0.0
        self.ckpt_step = 0
        self.hb_next = math.inf
        self.blocked_since: float | None = None
        self.first_dead = ""
        self.nominal = spec.step_time
        self.compute = np.full(self.world, COMPUTE_SHARE * spec.step_time)
        self.wait = np.zeros(self.world)
        self.noise = np.ones(self.world)
        self.share = np.ones(self.world)
        self.reserved_now = np.full(self.world, self.reserved0)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.state == "running"

    def start(self, t: float) -> None:
        data = {"kind": "training", "placement": self.placement, "world_size": self.world}
        if self.spec.checkpoint_every > 0:  # the script knows its interval: the SDK passes it on
            data["checkpoint_every"] = self.spec.checkpoint_every
        if self.restarts:
            data |= {"restart": self.restarts, "resumed_from_step": self.step}
        self.events.append(Event(t, "job_started", {"job": self.spec.name}, data))
        self.state = "running"
        self.alive[:] = True
        self.blocked_since = None
        self.hb_next = math.floor(t) + self.hb_phase
        if self.hb_next < t:
            self.hb_next += HEARTBEAT_PERIOD
        self.ckpt_ref = t
        self.last_step_end = t
        self._begin_phase(t, "init", float(self.rng.uniform(10.0, 20.0)))
        unusable = np.flatnonzero(~self.fleet.usable[self.gpu_idx])
        if unusable.size:
            r = int(unusable[0])
            self.fail(
                t, f"rank {r}: CUDA error: no CUDA-capable device is detected on {self.rank_nodes[r]}", 1
            )

    def restart(self, t: float) -> None:
        """The scheduler relaunches a failed or blocked job from its last good checkpoint."""
        if self.state not in ("running", "failed") or t >= self.spec.end:
            return
        self.restarts += 1
        self.step = self.good_ckpt_step
        self.reserved_now = np.full(self.world, self.reserved0)
        self.retries = np.zeros(self.world)  # new processes, new allocators
        self.start(t)

    def end(self, t: float) -> None:
        if self.running:
            self.events.append(Event(t, "job_ended", {"job": self.spec.name}, {"step": self.step}))
        if self.state in ("running", "pending"):
            self.state = "ended"
            self.alive[:] = False

    def fail(self, t: float, reason: str, exit_code: int) -> None:
        if not self.running:
            return
        data = {"reason": reason, "exit_code": exit_code, "step": self.step}
        self.events.append(Event(t, "job_failed", {"job": self.spec.name}, data))
        self.state = "failed"
        self.alive[:] = False
        self.blocked_since = None

    def kill_rank(self, rank: int, t: float, cause: str) -> None:
        """A rank's process died: it goes silent, the others block in the next collective."""
        if not self.running or not self.alive[rank]:
            return
        self.sync(t)
        self.alive[rank] = False
        if self.blocked_since is None:
            self.blocked_since = t
            self.first_dead = f"rank {rank} ({cause})"
        self.sync(t)

    def ranks_on_gpu(self, i: int) -> list[int]:
        return [int(r) for r in np.flatnonzero(self.gpu_idx == i)]

    # -- progress ---------------------------------------------------------------------------------

    def _progressing(self) -> bool:
        c = self.cond
        return self.running and self.blocked_since is None and not c.hang and not c.idle

    def sync(self, t: float) -> None:
        """Bank the progress made so far and re-plan the rest under the conditions now in force."""
        if self.moving and self.dur > 0:
            self.frac = min(1.0, self.frac + (t - self.seg_start) / self.dur)
        self.seg_start = t
        self.moving = self._progressing()
        if self.phase == "step":
            self.dur = self._step_duration()

    def _begin_phase(self, t: float, phase: str, dur: float) -> None:
        self.phase = phase
        self.frac = 0.0
        self.seg_start = t
        self.dur = dur
        self.moving = self._progressing()

    def _phase_end(self) -> float:
        if not self.moving:
            return math.inf
        return self.seg_start + (1.0 - self.frac) * self.dur

    def _new_step(self, t: float) -> None:
        rng = self.rng
        z = rng.standard_normal(self.world + 1)
        self.nominal = self.spec.step_time * max(0.3, 1.0 + 0.02 * float(z[0]))
        self.noise = 1.0 - np.abs(0.012 * z[1:])
        self.wait = 0.002 + 0.0015 * np.abs(z[1:])
        if rng.random() < 0.004:  # a data-loader hiccup: one rank waits, everyone waits for it
            self.wait[int(rng.integers(self.world))] += self.nominal * float(rng.uniform(0.3, 1.2))
        self.step_started = t
        self._begin_phase(t, "step", 0.0)
        self.dur = self._step_duration()

    def _step_duration(self) -> float:
        c = self.cond
        perf = self.fleet.perf[self.gpu_idx]
        pace = self.noise * c.rank_pace * c.rank_slow
        self.compute = COMPUTE_SHARE * self.nominal * pace / perf + self.wait
        live = self.compute[self.alive] if self.alive.any() else self.compute
        slowest = float(live.max())
        self.share = self.compute / slowest
        comm = (1.0 - COMPUTE_SHARE) * self.nominal * c.comm_factor
        return (slowest + comm) * c.job_factor

    def advance(self, t_to: float) -> None:
        """Run the job up to ``t_to``, emitting what happens on the way, in time order."""
        while self.running:
            t_phase = self._phase_end()
            t_dog = (
                (self.blocked_since + self.spec.collective_timeout)
                if self.blocked_since is not None
                else math.inf
            )
            t_delay = self._delayed[0][0] if self._delayed else math.inf
            t_next = min(t_phase, self.hb_next, t_dog, t_delay)
            if t_next > t_to:
                break
            if t_next == t_delay:
                self.events.append(heapq.heappop(self._delayed)[2])
            elif t_next == self.hb_next:
                self._heartbeat(t_next)
            elif t_next == t_dog:
                timeout = self.spec.collective_timeout
                self.fail(
                    t_next, f"NCCL watchdog: collective timed out after {timeout:g} s; {self.first_dead}", 1
                )
            else:
                self._finish_phase(t_next)
        while self._delayed and self._delayed[0][0] <= t_to:
            self.events.append(heapq.heappop(self._delayed)[2])

    def _heartbeat(self, t: float) -> None:
        for r in np.flatnonzero(self.alive).tolist():
            self.events.append(Event(t, "heartbeat", dict(self.beat_labels[r]), {"step": self.step}))
        self.hb_next = t + HEARTBEAT_PERIOD

    def _finish_phase(self, t: float) -> None:
        if self.phase == "step":
            self.step += 1
            self._emit_records(t)
            self.last_step_end = t
            if self.spec.steps is not None and self.step >= self.spec.steps:
                self.end(t)
                return
            every = self.spec.checkpoint_every
            if every > 0 and t - self.ckpt_ref >= every and not self.cond.ckpt_stop:
                self._start_checkpoint(t)
                return
        elif self.phase == "ckpt":
            self._complete_checkpoint(t)
        self._new_step(t)

    # -- checkpoints ------------------------------------------------------------------------------

    def _start_checkpoint(self, t: float) -> None:
        dur = float(np.clip(self.spec.checkpoint_seconds * self.rng.lognormal(0.0, 0.2), 10.0, 60.0))
        self.ckpt_step = self.step
        for r in np.flatnonzero(self.alive).tolist():
            self.events.append(Event(t, "checkpoint_started", dict(self.beat_labels[r]), {"step": self.step}))
        self._begin_phase(t, "ckpt", dur)

    def _complete_checkpoint(self, t: float) -> None:
        fail = self.cond.ckpt_fail
        live = np.flatnonzero(self.alive).tolist()
        failing = set(live if fail and fail[0] else live[-1:] if fail else [])
        took = t - self.seg_start + self.frac * self.dur
        for r in live:
            labels = dict(self.beat_labels[r])
            if r in failing and fail is not None:
                self.events.append(
                    Event(t, "checkpoint_failed", labels, {"step": self.ckpt_step, "reason": fail[1]})
                )
            else:
                secs = round(took * float(self.rng.uniform(0.9, 1.0)), 3)
                data = {"step": self.ckpt_step, "bytes": self.ckpt_bytes, "seconds": secs}
                self.events.append(Event(t, "checkpoint_completed", labels, data))
        self.ckpt_ref = t
        if not failing:
            ok = not self.cond.ckpt_corrupt
            if ok:
                self.good_ckpt_step = self.ckpt_step
            verify_at = t + float(self.rng.uniform(2.0, 8.0))
            event = Event(
                verify_at, "checkpoint_verified", {"job": self.spec.name}, {"step": self.ckpt_step, "ok": ok}
            )
            self._seq += 1
            heapq.heappush(self._delayed, (verify_at, self._seq, event))

    # -- per-step metrics -------------------------------------------------------------------------

    def _loss_base(self, k: float) -> float:
        s = self.spec
        loss: float = s.final_loss + (s.initial_loss - s.final_loss) * math.pow(1.0 + k / 30.0, -0.55)
        if k > self.drop_step:
            loss *= 1.0 - 0.035 * (1.0 - math.exp(-(k - self.drop_step) / 60.0))
        return loss

    def _learning_rate(self, k: int) -> float:
        s = self.spec
        warm = min(1.0, (k + 1) / s.warmup_steps) if s.warmup_steps else 1.0
        progress = min(1.0, k / self.expected_steps)
        cosine = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
        return s.learning_rate * warm * cosine * (1.0 / 3.0 if k >= self.drop_step else 1.0)

    def _job_loss(self, t: float) -> float:
        k = self.step
        c = self.cond
        loss = self._loss_base(k)
        for e in c.loss_effects:
            if e.kind == "plateau":
                loss = self._loss_base(e.step0)
            elif e.kind == "divergence":
                loss = self._loss_base(e.step0) * (1.0 + e.rate * max(0.0, t - e.t0) / 60.0)
        for e in c.loss_effects:
            if e.kind == "spike":
                loss *= 1.0 + (e.factor - 1.0) * math.exp(-max(0, k - e.step0) / e.decay)
        return loss

    def _emit_records(self, t: float) -> None:
        rng, c, w = self.rng, self.cond, self.world
        z = rng.standard_normal((4, w))
        k = self.step
        loss_job = self._job_loss(t) * (1.0 + 0.012 * float(rng.standard_normal()))
        if rng.random() < 0.002:
            loss_job *= 1.06
        loss = loss_job * (1.0 + 0.02 * z[0])
        g_job = (0.3 + 3.0 * math.exp(-k / 120.0)) * float(rng.lognormal(0.0, 0.08))
        if rng.random() < 0.003:
            g_job *= float(rng.uniform(1.2, 1.5))
        grad = g_job * np.exp(0.05 * z[1]) * c.grad
        if c.nan:
            loss = np.full(w, np.nan)
            grad = np.full(w, np.nan)
        step_seconds = float(t - self.step_started)
        tokens = self.spec.batch_tokens / w / step_seconds
        compute = self.compute
        skew = compute - float(compute[self.alive].min())
        alloc = self.alloc0 * (1.0 + 0.003 * z[2])
        frag = self.frag0.copy()
        for r, (t0, rate) in c.frag.items():
            frag[r] = self.frag0[r] + rate * max(0.0, t - t0) / 60.0
        wanted = self.alloc0 / (1.0 - np.minimum(frag, 0.9))
        reserved = np.minimum(wanted, 0.97 * self.total_mem)
        pressure = (wanted - reserved) / self.total_mem
        since = t - self.last_step_end
        self.retries += rng.poisson(np.maximum(frag - 0.12, 0.0) * 2.0 * since + pressure * 40.0 * since)
        frag_ratio = 1.0 - alloc / reserved
        lr = self._learning_rate(k)
        cols = [
            loss.tolist(),
            grad.tolist(),
            skew.tolist(),
            self.wait.tolist(),
            alloc.tolist(),
            reserved.tolist(),
            frag_ratio.tolist(),
            self.retries.tolist(),
        ]
        job = self.spec.name
        samples = tokens / self.spec.seq_len
        for r in np.flatnonzero(self.alive).tolist():
            metrics = {
                "loss": cols[0][r],
                "grad_norm": cols[1][r],
                "step_seconds": step_seconds,
                "data_wait_seconds": cols[3][r],
                "tokens_per_second": tokens,
                "samples_per_second": samples,
                "learning_rate": lr,
                "collective_arrival_skew_seconds": cols[2][r],
                "memory_allocated_bytes": cols[4][r],
                "memory_reserved_bytes": cols[5][r],
                "memory_fragmentation_ratio": cols[6][r],
                "alloc_retries_total": cols[7][r],
            }
            self.records.append(TrainingRecord(t, job, r, k, metrics, dict(self.rec_labels[r])))
        self.reserved_now = reserved

    # -- what the GPUs and hosts see --------------------------------------------------------------

    def fill_demand(self, d: Demand) -> None:
        if not self.running:
            return
        idx = self.gpu_idx
        alive = self.alive
        for i in idx.tolist():
            d.jobs[i] = self.spec.name
        live = idx[alive]
        if live.size == 0:
            return
        c = self.cond
        d.mem[live] = self.reserved_now[alive]
        host = self.nodes
        np.add.at(host.host_mem, self.node_idx[alive], 40 * 1024**3)
        if c.idle:
            return
        d.active[live] = True
        base_power = self.fleet.power_base[live]
        if not self.moving:  # blocked in a collective: NCCL kernels spin, SMs mostly idle
            d.util[live], d.sm[live], d.power[live], d.mem_util[live] = 100.0, 0.04, 0.27, 1.0
        elif self.phase == "init":
            d.util[live], d.sm[live], d.power[live], d.mem_util[live] = 25.0, 0.05, 0.2, 5.0
            d.pcie[live] = 8e9
        elif self.phase == "ckpt":
            d.util[live] = self.rng.uniform(5.0, 35.0, live.size)
            d.sm[live], d.power[live], d.mem_util[live] = 0.03, 0.2, 8.0
            d.pcie[live] = 1.2e10
            np.add.at(host.storage_tx, self.node_idx[alive], self.ckpt_bytes / max(self.dur, 1.0))
        else:
            share = self.share[alive]
            d.util[live] = 99.6
            d.sm[live] = self.sm_base * share
            d.power[live] = base_power * (0.45 + 0.55 * share)
            d.mem_util[live] = 30.0 * share
            d.nvlink[live] = 1.2e11 * share
            d.pcie[live] = 2e9
            np.add.at(host.busy_gpus, self.node_idx[alive], 1.0)
            if self.multi_node:
                np.add.at(host.ib_bw, self.node_idx[alive], 3e9)


def true_slowdown(job: TrainingJob) -> float:
    """How much longer the job's current step takes than it would on healthy GPUs and links
    (ground truth for the productivity model; noise and data-loader waits count as healthy)."""
    if not job.alive.any():
        return 1.0
    c, alive = job.cond, job.alive
    perf = job.fleet.perf[job.gpu_idx][alive]
    part = job.fleet.mods.part_slowdown[job.gpu_idx][alive]  # slower parts placed on: the normal pace
    base = COMPUTE_SHARE * job.nominal * job.noise[alive] * c.rank_pace[alive] * part
    comm = (1.0 - COMPUTE_SHARE) * job.nominal
    healthy = float((base + job.wait[alive]).max()) + comm
    actual = (
        float((base * c.rank_slow[alive] / (perf * part) + job.wait[alive]).max()) + comm * c.comm_factor
    ) * c.job_factor
    return actual / healthy
