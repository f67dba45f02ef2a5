"""Training-job faults: hangs, crashes, dead or slow ranks, bad losses and gradients, checkpoints."""

from __future__ import annotations

from gpuscope.sim.faults.base import Effect, register
from gpuscope.sim.training import LossEffect, TrainingJob


@register
class IdleAllocation(Effect):
    """The job keeps its GPUs (and their memory) but runs nothing on them."""

    kinds = ("idle_allocation",)

    def apply(self) -> None:
        self.workload.cond.idle = True


@register
class TrainingHang(Effect):
    """Every rank is alive and heartbeating but no step completes (a deadlocked collective)."""

    kinds = ("training_hang",)

    def apply(self) -> None:
        self.job.cond.hang = True


@register
class JobCrash(Effect):
    """The job's processes exit abnormally; with a duration, the scheduler relaunches it after."""

    kinds = ("job_crash",)

    def begin(self, t: float) -> None:
        job = self.workload
        if isinstance(job, TrainingJob):
            job.breakers.add(self.fault.index)
        job.fail(t, str(self.fault.params["reason"]), int(self.fault.params["exit_code"]))

    def finish(self, t: float) -> None:
        job = self.workload
        if isinstance(job, TrainingJob):
            super().finish(t)
        else:
            job.restart(t)


@register
class RankDropout(Effect):
    """One rank's process dies; the others block in the next collective (a knock-on stall)."""

    kinds = ("rank_dropout",)

    def begin(self, t: float) -> None:
        job = self.job
        if job.running and job.alive[self.rank]:
            job.breakers.add(self.fault.index)
            job.kill_rank(self.rank, t, f"process exited with code {int(self.fault.params['exit_code'])}")


@register
class Straggler(Effect):
    """One rank computes slower; it arrives late at every collective and sets the job's pace."""

    kinds = ("straggler",)

    def apply(self) -> None:
        self.job.cond.rank_slow[self.rank] *= self.param("slowdown")


@register
class WorseningStraggler(Effect):
    """A straggler that slows ``worsen`` times further ``worsen_after`` seconds after onset."""

    kinds = ("straggler_worsening",)
    onset = 0.0
    worse = False

    def begin(self, t: float) -> None:
        self.onset = t

    def apply(self) -> None:
        factor = self.param("slowdown") * (self.param("worsen") if self.worse else 1.0)
        self.job.cond.rank_slow[self.rank] *= factor

    def advance(self, t: float) -> None:
        if not self.worse and t >= self.onset + self.param("worsen_after"):
            self.worse = True
            self.job.cond.rank_slow[self.rank] *= self.param("worsen")


@register
class SlowPlacement(Effect):
    """A group of ranks computes slower for as long as the fault lasts (from the start: a job
    placed on mixed hardware). It is the job's normal pace, not lost work, in the ground truth;
    ranks past the job's world are ignored. With ``clocks`` the group's GPUs themselves run at
    lower SM clocks (slower parts, clock limits), which is how the ranks get slower; the ground
    truth takes those clocks as the GPUs' normal speed (``Mods.part_slowdown``) too."""

    kinds = ("slow_placement",)

    def apply(self) -> None:
        first = int(self.param("first_rank"))
        group = slice(first, first + int(self.param("ranks")))
        if self.fault.params["clocks"]:
            mods, gpus = self.world.fleet.mods, self.job.gpu_idx[group]
            mods.slowdown[gpus] *= self.param("slowdown")
            mods.part_slowdown[gpus] *= self.param("slowdown")
        else:
            self.job.cond.rank_pace[group] *= self.param("slowdown")


@register
class StepTimeRegression(Effect):
    kinds = ("step_time_regression",)

    def apply(self) -> None:
        self.job.cond.job_factor *= self.param("factor")


@register
class LossNan(Effect):
    kinds = ("loss_nan",)

    def apply(self) -> None:
        self.job.cond.nan = True


class _LossCurve(Effect):
    """A change of the loss curve, anchored at the step the job had reached at onset."""

    curve = ""

    def begin(self, t: float) -> None:
        self.anchor = LossEffect(
            self.curve,
            t,
            self.job.step,
            factor=self._get("factor", 1.0),
            decay=self._get("decay_steps", 1.0),
            rate=self._get("rate", 0.0),
        )

    def _get(self, name: str, default: float) -> float:
        return float(self.fault.params.get(name, default))

    def apply(self) -> None:
        self.job.cond.loss_effects.append(self.anchor)


@register
class LossSpike(_LossCurve):
    kinds = ("loss_spike",)
    curve = "spike"


@register
class LossDivergence(_LossCurve):
    kinds = ("loss_divergence",)
    curve = "divergence"


@register
class LossPlateau(_LossCurve):
    kinds = ("loss_plateau",)
    curve = "plateau"


@register
class GradExplosion(Effect):
    kinds = ("grad_explosion",)

    def apply(self) -> None:
        self.job.cond.grad *= self.param("factor")


@register
class GradientSkew(Effect):
    kinds = ("gradient_skew",)

    def apply(self) -> None:
        self.job.cond.grad[self.rank] *= self.param("factor")


@register
class CheckpointFailure(Effect):
    """Saves fail (on the last rank, or on all): ``checkpoint_failed`` instead of completed."""

    kinds = ("checkpoint_failure",)

    def apply(self) -> None:
        self.job.cond.ckpt_fail = (bool(self.fault.params["all_ranks"]), str(self.fault.params["reason"]))


@register
class CheckpointCorrupt(Effect):
    """Saves complete but verification fails (``checkpoint_verified`` with ok false)."""

    kinds = ("checkpoint_corrupt",)

    def apply(self) -> None:
        self.job.cond.ckpt_corrupt = True


@register
class CheckpointStop(Effect):
    """The job silently stops starting checkpoints while it keeps training."""

    kinds = ("checkpoint_stop",)

    def apply(self) -> None:
        self.job.cond.ckpt_stop = True


@register
class MemoryFragmentation(Effect):
    """The rank's allocator reserves ever more than it allocates, then retries cudaMalloc."""

    kinds = ("memory_fragmentation",)

    def begin(self, t: float) -> None:
        self.t0 = t

    def apply(self) -> None:
        self.job.cond.frag[self.rank] = (self.t0, self.param("rate"))
