"""The training SDK: what only the training process knows, reported without slowing its loop.

``run = gpuscope.init(job="llm", hub="http://hub:7470")``; then ``run.log(step, loss=...)``,
``with run.step(): ...``, ``with run.checkpoint(step, path): ...`` and ``run.finish()``.
torch is imported only by the features that need it.
"""

from __future__ import annotations

import os

from gpuscope.sdk.env import Placement, PlacementError, detect_placement, hub_from_env
from gpuscope.sdk.run import Run

__all__ = ["Placement", "PlacementError", "Run", "detect_placement", "init"]


def init(
    job: str | None = None,
    hub: str | None = None,
    *,
    token: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    node: str | None = None,
    gpu: str | int | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    capacity: int = 100_000,
    flush_interval: float = 0.25,
    heartbeat_interval: float = 1.0,
    memory_interval: float | None = 5.0,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    checkpoint_every: float | None = None,
    collectives: bool = True,
    last_words: bool = True,
) -> Run:
    """Start reporting this rank of ``job`` to ``hub``.

    Job, rank, local rank, world size and node come from the launcher's environment when not
    given (torchrun, Slurm, Kubernetes; ``GPUSCOPE_*`` variables override), the hub and token
    from ``GPUSCOPE_HUB`` / ``GPUSCOPE_TOKEN``. ``flops_per_step`` (per rank) and ``peak_flops``
    (of its GPU) turn step times into MFU. ``checkpoint_every``, the seconds between the
    checkpoints the script saves, lets the hub tell a job that never saves its first one
    (``checkpoint_overdue``) before it could learn the job's interval.

    With ``collectives`` (the default), the first ``DistributedDataParallel`` model to run forward
    gets collective timing, which names stragglers and ranks that never arrive. With
    ``last_words`` (the default), an uncaught exception or SIGTERM reports this rank's failure and
    its cause before the process goes (:mod:`gpuscope.sdk.lastwords`).
    """
    env_hub, env_token = hub_from_env()
    hub = hub or env_hub
    if not hub:
        raise ValueError("no hub: pass gpuscope.init(hub='http://HOST:7470') or set GPUSCOPE_HUB")
    placement = detect_placement(
        job=job, rank=rank, local_rank=local_rank, world_size=world_size, node=node, gpu=gpu
    )
    run = Run(
        placement,
        hub,
        token=token or env_token,
        state_dir=state_dir,
        capacity=capacity,
        flush_interval=flush_interval,
        heartbeat_interval=heartbeat_interval,
        memory_interval=memory_interval,
        flops_per_step=flops_per_step,
        peak_flops=peak_flops,
        checkpoint_every=checkpoint_every,
        last_words=last_words,
    )
    if collectives:
        run.watch_collectives()
    return run
