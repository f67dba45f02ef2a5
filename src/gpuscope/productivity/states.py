"""The states a GPU-second can be in, their causes, and who must act on each (one home for these facts).

Every GPU-second gets exactly one state. The states, in the order a GPU is judged (the first that
holds wins): ``maintenance`` (the node is drained), ``down`` (node unreachable, GPU lost, fatal
XID, the scheduler holds the node out and the GPU computes nothing), ``idle_unallocated`` (no job),
``idle_allocated`` (a job holds it but it computes nothing), ``busy_not_productive`` (it computes
but the job makes no progress: hung, waiting in a collective for a dead peer, starting or
restarting, checkpointing), ``degraded`` (the job progresses, slower than its own baseline: a share
of the second is lost), ``productive``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.rules import spec

PRODUCTIVE = "productive"
BUSY_NOT_PRODUCTIVE = "busy_not_productive"
DEGRADED = "degraded"
IDLE_ALLOCATED = "idle_allocated"
IDLE_UNALLOCATED = "idle_unallocated"
DOWN = "down"
MAINTENANCE = "maintenance"

STATES: tuple[str, ...] = (
    PRODUCTIVE,
    DEGRADED,
    BUSY_NOT_PRODUCTIVE,
    IDLE_ALLOCATED,
    IDLE_UNALLOCATED,
    DOWN,
    MAINTENANCE,
)
#: states whose GPU time is wasted in full (degraded wastes only its lost fraction)
WASTE_STATES: frozenset[str] = frozenset({BUSY_NOT_PRODUCTIVE, IDLE_ALLOCATED, DOWN})


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a GPU-second is in its state, and the alert rule whose owner must act on it."""

    state: str
    name: str
    rule: str | None  # the catalog rule that names the owner; None: the owner is given directly
    fixed_owner: str = ""

    @property
    def owner(self) -> str:
        return spec(self.rule).owner if self.rule is not None else self.fixed_owner


def _causes(*rows: Cause) -> dict[str, Cause]:
    return {c.name: c for c in rows}


CAUSES: dict[str, Cause] = _causes(
    Cause(PRODUCTIVE, "training", None, "model"),
    Cause(PRODUCTIVE, "serving", None, "serving"),
    Cause(PRODUCTIVE, "unattributed", None, "platform"),
    Cause(DEGRADED, "throttled", "gpu_thermal_throttle"),
    Cause(DEGRADED, "slow_steps", "step_time_regression"),
    Cause(BUSY_NOT_PRODUCTIVE, "hung", "training_stalled"),
    Cause(BUSY_NOT_PRODUCTIVE, "collective_wait", "rank_lost"),
    Cause(BUSY_NOT_PRODUCTIVE, "startup", None, "model"),
    Cause(BUSY_NOT_PRODUCTIVE, "restart", "job_failed"),
    Cause(BUSY_NOT_PRODUCTIVE, "checkpoint", "checkpoint_failed"),
    Cause(IDLE_ALLOCATED, "idle_job", "gpu_idle_allocated"),
    Cause(IDLE_ALLOCATED, "dead_rank", "rank_lost"),
    Cause(IDLE_UNALLOCATED, "no_job", None, "platform"),
    Cause(DOWN, "node_unreachable", "node_unreachable"),
    Cause(DOWN, "lost_gpu", "gpu_lost"),
    Cause(DOWN, "fatal_xid", "gpu_xid_fatal"),
    # the scheduler (Slurm) holds the node out of service: down, drained or draining, failing
    Cause(DOWN, "draining", None, "platform"),
    Cause(MAINTENANCE, "drained", None, "platform"),
)


def owner_of(cause: str) -> str:
    return CAUSES[cause].owner


def state_of(cause: str) -> str:
    return CAUSES[cause].state


#: a training job whose steps take this many times its own healthy step time is degraded (the
#: simulator's ground truth uses the same bar for its true slowdown)
DEGRADED_AT = 1.05
