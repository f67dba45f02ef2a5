"""Ground truth of GPU time: what each simulated GPU really did in every sampled interval.

The simulator knows each GPU's true condition (its node down, lost, killed by a fatal error; the
job holding it hung, blocked behind a dead rank, starting, checkpointing, slowed); this module
turns that into the productivity model's causes (:mod:`gpuscope.productivity.states`), so
``sim-eval --report`` can set GPU-hours measured by the hub beside the true ones.
"""

from __future__ import annotations

from collections import defaultdict

from gpuscope.productivity.states import DEGRADED_AT, state_of
from gpuscope.sim.training import TrainingJob, true_slowdown
from gpuscope.sim.world import World


def _training_cause(job: TrainingJob, i: int, throttled: bool) -> tuple[str, float]:
    rank = job.ranks_on_gpu(i)[0]
    if job.cond.idle:
        return "idle_job", 0.0
    if not job.alive[rank]:
        return "dead_rank", 0.0
    if not job.moving:
        return ("hung" if job.blocked_since is None else "collective_wait"), 0.0
    if job.phase == "init":
        return ("restart" if job.restarts else "startup"), 0.0
    if job.phase == "ckpt":
        return "checkpoint", 0.0
    slowdown = true_slowdown(job)
    if slowdown > DEGRADED_AT:
        return ("throttled" if throttled else "slow_steps"), 1.0 - 1.0 / slowdown
    return "training", 0.0


class GroundTruth:
    """GPU-seconds per true cause (and the degraded share truly lost), summed over the run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.lost_seconds = 0.0

    def record(self, world: World, dt: float) -> None:
        """Count ``dt`` seconds of every GPU in the condition it is in now."""
        for i in range(world.fleet.n):
            cause, lost = self._cause(world, i)
            self.seconds[cause] += dt
            self.lost_seconds += dt * lost

    @staticmethod
    def _cause(world: World, i: int) -> tuple[str, float]:
        fleet = world.fleet
        mods = fleet.mods
        if world.nodes.down[i // world.per_node]:
            return "node_unreachable", 0.0
        if mods.lost[i]:
            return "lost_gpu", 0.0
        if mods.killed[i]:
            return "fatal_xid", 0.0
        name = fleet.demand.jobs[i]
        if name is None:
            return "no_job", 0.0
        service = world.services.get(name)
        if service is not None:
            return ("idle_job" if service.cond.idle else "serving"), 0.0
        job = world.jobs[name]
        # against each GPU's normal speed: a slower part a job was placed on is not throttled
        perf = fleet.perf[job.gpu_idx] * mods.part_slowdown[job.gpu_idx]
        throttled = bool((perf < 1.0 / DEGRADED_AT).any())
        return _training_cause(job, i, throttled)

    def gpu_hours(self) -> dict[str, float]:
        """True GPU-hours per state."""
        out: dict[str, float] = defaultdict(float)
        for cause, secs in self.seconds.items():
            out[state_of(cause)] += secs / 3600
        return dict(out)
