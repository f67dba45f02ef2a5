"""Where a training process sits: job, rank, local rank, world size, node and GPU, from its environment.

Launchers already tell every process who it is (torchrun, Slurm, Kubernetes operators), so the
SDK reads that rather than asking the user; explicit arguments to :func:`gpuscope.init` win.
``GPUSCOPE_*`` variables override the launcher's for the cases a launcher cannot know (a job
name shared across restarts, the node name the agent uses).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuscope.collect.nvml_api import nvml_library_present, uuid_indices
from gpuscope.identity import job_key, rank_gpu

#: Where each field is looked up, first hit wins: gpuscope's own, torchrun, Slurm, Open MPI / Kubernetes.
_RANK = ("GPUSCOPE_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK = ("GPUSCOPE_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
_WORLD = ("GPUSCOPE_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
#: NODE_NAME is what Kubernetes' downward API conventionally sets (spec.nodeName).
_NODE = ("GPUSCOPE_NODE", "SLURMD_NODENAME", "NODE_NAME")
#: read only when no launcher names the job (gpuscope.identity.job_key): a bare name, not unique
_JOB_NAME = ("SLURM_JOB_NAME", "JOB_NAME")
#: variables that name a process's GPUs (CUDA, Slurm's gres, the NVIDIA container toolkit)
_GPU_NAMED = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES")
_HUB = ("GPUSCOPE_HUB",)
_TOKEN = ("GPUSCOPE_TOKEN",)


class PlacementError(ValueError):
    """The environment says something about placement that cannot be right."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Who this process is in its job and where it runs (the entity graph of DESIGN §2)."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    node: str
    #: the GPU's index as NVML numbers it; None for a rank without a GPU (CPU-only training)
    gpu: str | None
    #: the GPU's UUID when the environment names it (containers, NVIDIA_VISIBLE_DEVICES)
    gpu_uuid: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        """Labels that place this rank's data: job, rank, node, and gpu unless it has none."""
        out = {"job": self.job, "rank": str(self.rank), "node": self.node}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        return out


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value:
            return name, value
    return None


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    found = _first(env, names)
    if found is None:
        return default
    name, raw = found
    try:
        value = int(raw)
    except ValueError:
        raise PlacementError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise PlacementError(f"{name}={raw!r} must not be negative")
    return value


def _nvml_uuid_index() -> Mapping[str, str]:
    return uuid_indices() if nvml_library_present() else {}


#: ``gpuscope.init(gpu=...)`` values that say the rank has no GPU
NO_GPU = frozenset({"", "cpu", "none"})


def _no_visible_gpu(env: Mapping[str, str]) -> bool:
    """CUDA_VISIBLE_DEVICES set to nothing, or starting with an invalid ordinal such as -1, hides
    every GPU from the process (CUDA stops at the first invalid entry)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return False
    first = visible.split(",", 1)[0].strip()
    return not first or first.startswith("-") or first.lower() == "nodevfiles"


def _job(env: Mapping[str, str]) -> str | None:
    return job_key(env) or next((env[n] for n in _JOB_NAME if env.get(n)), None)


def detect_placement(
    env: Mapping[str, str] | None = None,
    *,
    job: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    node: str | None = None,
    gpu: str | int | None = None,
    uuid_index: Callable[[], Mapping[str, str]] = _nvml_uuid_index,
    gpu_present: Callable[[], bool] = nvml_library_present,
) -> Placement:
    """The placement from explicit arguments, then the environment; raises :class:`PlacementError`.

    The job and GPU are those the agent and dcgm-exporter report for the same process
    (:mod:`gpuscope.identity`); ``uuid_index`` is NVML's UUID -> index map, asked only when the
    environment names the GPU by UUID. A rank has no GPU (``gpu`` None: its alerts name no GPU)
    when ``gpu`` is ``"cpu"`` or ``""``, when ``CUDA_VISIBLE_DEVICES`` hides every device, or when
    no environment variable names one and ``gpu_present`` (the driver's NVML library) says no.
    """
    env = os.environ if env is None else env
    job = job or _job(env)
    if not job:
        raise PlacementError(
            "no job name: pass gpuscope.init(job=...) or set GPUSCOPE_JOB "
            "(Slurm's SLURM_JOB_ID, torchrun's TORCHELASTIC_RUN_ID unless 'none', and a Kubeflow "
            "PyTorchJob's MASTER_ADDR are read too)"
        )
    rank = _int(env, _RANK, 0) if rank is None else rank
    local_rank = _int(env, _LOCAL_RANK, rank) if local_rank is None else local_rank
    world_size = _int(env, _WORLD, rank + 1) if world_size is None else world_size
    if rank < 0 or local_rank < 0:
        raise PlacementError(f"rank ({rank}) and local rank ({local_rank}) must not be negative")
    if world_size <= rank:
        raise PlacementError(f"rank {rank} does not fit in a world of size {world_size}")
    found = _first(env, _NODE)
    node = node or (found[1] if found else socket.gethostname().split(".")[0] or "localhost")
    ref = rank_gpu(env, local_rank, uuid_index)
    if gpu is not None:
        gpu_label = None if str(gpu).lower() in NO_GPU else str(gpu)
    elif _no_visible_gpu(env) or (not any(env.get(n) for n in _GPU_NAMED) and not gpu_present()):
        gpu_label = None
    else:
        # a GPU known only by UUID keeps the UUID rather than a wrong index
        gpu_label = ref.index or ref.uuid or str(local_rank)
    return Placement(
        job=job,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        node=node,
        gpu=gpu_label,
        gpu_uuid=ref.uuid if gpu_label is not None else None,
    )


def hub_from_env(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(hub URL, token) from GPUSCOPE_HUB and GPUSCOPE_TOKEN."""
    env = os.environ if env is None else env
    hub, token = _first(env, _HUB), _first(env, _TOKEN)
    return (hub[1] if hub else None), (token[1] if token else None)
