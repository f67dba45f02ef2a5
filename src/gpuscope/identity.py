"""One job key and one GPU per training rank, whichever path reports it.

The agent (a process's ``/proc/<pid>/environ`` and cgroup), the training SDK (its own
environment) and dcgm-exporter (``hpc_job``, the Slurm job id its prolog mapping file names) must
agree, or training records do not join GPU telemetry. The job key is, first hit wins:

1. ``GPUSCOPE_JOB``, the user's own;
2. ``SLURM_JOB_ID`` (``SLURM_JOBID`` is its old spelling): what the cgroup path (``job_<id>``) and
   dcgm-exporter's ``hpc_job`` carry too. Each array task has its own id (``SLURM_ARRAY_JOB_ID``
   groups them); a requeued job keeps its id (``SLURM_RESTART_COUNT`` counts the restarts);
3. ``TORCHELASTIC_RUN_ID`` unless it is ``"none"``, torchrun's default ``--rdzv-id``;
4. a Kubeflow PyTorchJob's name: its pods get ``MASTER_ADDR=<job>-master-0`` and ``PET_*``.

The GPU is the physical index NVML and the agent use. ``CUDA_VISIBLE_DEVICES`` is relative when
Slurm constrains devices (``SLURM_STEP_GPUS=5``, ``CUDA_VISIBLE_DEVICES=0``) and inside a container
(``NVIDIA_VISIBLE_DEVICES=<host GPU>``), and may name a UUID; those resolve through
``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``, ``NVIDIA_VISIBLE_DEVICES`` and NVML's UUID -> index map.

Sources: SchedMD/slurm doc/man/man1/srun.1 and sbatch.1 "OUTPUT ENVIRONMENT VARIABLES", and
doc/html/gres.shtml ("CUDA_VISIBLE_DEVICES ... will be set to a value of 0") at 284c3b9;
pytorch/pytorch torch/distributed/run.py (``--rdzv-id`` default ``"none"``); kubeflow/training-operator
pkg/controller.v1/pytorch/envvar.go (MASTER_ADDR of the master replica, PET_NNODES,
PET_NPROC_PER_NODE); NVIDIA container toolkit (NVIDIA_VISIBLE_DEVICES: indices, UUIDs, "all").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

TORCHRUN_DEFAULT_RUN_ID = "none"
_KUBEFLOW_MASTER_SUFFIX = "-master-0"
_KUBEFLOW_MARKERS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK")
#: NVIDIA_VISIBLE_DEVICES values that name no particular GPU
_NVD_SPECIAL = frozenset({"", "all", "none", "void"})


def job_key(env: Mapping[str, str]) -> str | None:
    """The job this environment belongs to, as every path names it (see the module docstring)."""
    for name in ("GPUSCOPE_JOB", "SLURM_JOB_ID", "SLURM_JOBID"):
        if env.get(name):
            return env[name]
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != TORCHRUN_DEFAULT_RUN_ID:
        return run_id
    master = env.get("MASTER_ADDR", "")
    if master.endswith(_KUBEFLOW_MASTER_SUFFIX) and any(env.get(m) for m in _KUBEFLOW_MARKERS):
        return master[: -len(_KUBEFLOW_MASTER_SUFFIX)]
    return None


def _entries(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _is_uuid(entry: str) -> bool:
    return entry.startswith(("GPU-", "MIG-"))


@dataclass(frozen=True, slots=True)
class GpuRef:
    """The physical GPU of a rank: its index as NVML numbers it (None when unknown) and its UUID."""

    index: str | None
    uuid: str | None = None


def rank_gpu(
    env: Mapping[str, str],
    local_rank: int,
    uuid_index: Callable[[], Mapping[str, str]] | None = None,
) -> GpuRef:
    """The physical GPU a rank uses; ``uuid_index`` gives NVML's ``{uuid: index}`` when a UUID is all
    the environment names (called only then)."""
    visible = _entries(env.get("CUDA_VISIBLE_DEVICES"))
    if visible:
        entry = (
            visible[0] if len(visible) == 1 else visible[local_rank] if local_rank < len(visible) else None
        )
    else:
        entry = str(local_rank)
    if entry is None:
        return GpuRef(str(local_rank))
    if not _is_uuid(entry) and entry.isdigit():
        slurm = _entries(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
        container = [v for v in _entries(env.get("NVIDIA_VISIBLE_DEVICES")) if v not in _NVD_SPECIAL]
        ordinal = int(entry)
        if slurm and not set(visible) <= set(slurm) and ordinal < len(slurm):
            entry = slurm[ordinal]  # ConstrainDevices: ordinals within the job's GPUs
        elif container and ordinal < len(container):
            entry = container[ordinal]  # the container's GPUs, as the host names them
    if _is_uuid(entry):
        index = (uuid_index() if uuid_index is not None else {}).get(entry)
        return GpuRef(index, entry)
    return GpuRef(entry)


def pod_key(namespace: str, name: str) -> str:
    """The ``pod`` label on every path (kubelet, dcgm-exporter, API server, and a process's cgroup once
    :class:`gpuscope.collect.podresources.PodNames` resolves its UID): ``namespace/name``.

    A name is unique only within its namespace; the UID, unique over time, is the ``pod_uid`` label."""
    return f"{namespace}/{name}"
