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


class _JobNow:
    """What a training job's GPUs share in one interval, worked out once for all of them."""

    __slots__ = ("_slowdown", "first_rank", "throttled")

    def __init__(self, job: TrainingJob) -> None:
        self.first_rank: dict[int, int] = {}
        for rank, i in enumerate(job.gpu_idx.tolist()):
            self.first_rank.setdefault(int(i), rank)
        # against each GPU's normal speed: a slower part a job was placed on is not throttled
        mods = job.fleet.mods
        perf = job.fleet.perf[job.gpu_idx] * mods.part_slowdown[job.gpu_idx]
        self.throttled = bool((perf < 1.0 / DEGRADED_AT).any())
        self._slowdown: float | None = None

    def slowdown(self, job: TrainingJob) -> float:
        if self._slowdown is None:
            self._slowdown = true_slowdown(job)
        return self._slowdown


def _training_cause(job: TrainingJob, i: int, now: _JobNow) -> tuple[str, float]:
    rank = now.first_rank[i]
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
    slowdown = now.slowdown(job)
    if slowdown > DEGRADED_AT:
        return ("throttled" if now.throttled else "slow_steps"), 1.0 - 1.0 / slowdown
    return "training", 0.0


class GroundTruth:
    """GPU-seconds per true cause (and the degraded share truly lost), summed over the run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.lost_seconds = 0.0

    def record(self, world: World, dt: float) -> None:
        """Count ``dt`` seconds of every GPU in the condition it is in now."""
        jobs: dict[str, _JobNow] = {}
        for i in range(world.fleet.n):
            cause, lost = self._cause(world, i, jobs)
            self.seconds[cause] += dt
            self.lost_seconds += dt * lost

    @staticmethod
    def _cause(world: World, i: int, jobs: dict[str, _JobNow]) -> tuple[str, float]:
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
        now = jobs.get(name)
        if now is None:
            now = jobs[name] = _JobNow(job)
        return _training_cause(job, i, now)

    def gpu_hours(self) -> dict[str, float]:
        """True GPU-hours per state."""
        out: dict[str, float] = defaultdict(float)
        for cause, secs in self.seconds.items():
            out[state_of(cause)] += secs / 3600
        return dict(out)
