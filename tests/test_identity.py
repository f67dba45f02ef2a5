"""One rank, three paths: the SDK's placement, the agent's NVML + procfs attribution and
dcgm-exporter's page agree on the job and the GPU.

Shapes from: SchedMD/slurm doc/html/gres.shtml and srun.1 at 284c3b9 (SLURM_STEP_GPUS global,
CUDA_VISIBLE_DEVICES relative under ConstrainDevices; cgroup v2 path .../job_<id>/step_<n>/...);
NVIDIA/dcgm-exporter internal/pkg/transformation/hpc.go at d5e5f51 (hpc_job); pytorch/pytorch
torch/distributed/run.py (TORCHELASTIC_RUN_ID "none" by default); kubeflow/training-operator
pkg/controller.v1/pytorch/envvar.go (MASTER_ADDR=<job>-master-0, PET_NNODES).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.collect.dcgm import map_samples
from gpuscope.collect.fake_nvml import FakeNvml, FakeProcess
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.nvml_api import uuid_indices
from gpuscope.collect.promtext import parse_exposition
from gpuscope.identity import job_key, rank_gpu
from gpuscope.sdk.env import detect_placement

PID = 4242
PHYSICAL_GPU = 5

SLURM_CONSTRAINED = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NAME": "train",
    "SLURM_STEP_GPUS": "5",
    "SLURM_JOB_GPUS": "5",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "1",
    "SLURMD_NODENAME": "n1",
    "CUDA_VISIBLE_DEVICES": "0",
}
TORCHRUN_IN_SBATCH = {
    **SLURM_CONSTRAINED,
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
}
ARRAY_TASK_RESTARTED = {
    **SLURM_CONSTRAINED,
    "SLURM_JOB_ID": "1240",
    "SLURM_ARRAY_JOB_ID": "1234",
    "SLURM_ARRAY_TASK_ID": "6",
    "SLURM_RESTART_COUNT": "2",
}


def agent_view(tmp_path: Path, env: dict[str, str], cgroup: str, fake: FakeNvml) -> dict[str, str]:
    proc = tmp_path / "proc" / str(PID)
    proc.mkdir(parents=True)
    (proc / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (proc / "cgroup").write_text(cgroup)
    fake.gpus[PHYSICAL_GPU].processes = [FakeProcess(PID, 2**30)]
    c = NvmlCollector("n1", proc_root=str(tmp_path / "proc"), lib=fake, watch_events=False)
    try:
        got = c.collect(1.0)
    finally:
        c.close()
    return next(e for f in got.frames for e in f.entities if e.get("pid") == str(PID))


def dcgm_view(job: str, fake: FakeNvml) -> dict[str, str]:
    uuid = fake.gpus[PHYSICAL_GPU].uuid
    page = f'DCGM_FI_DEV_GPU_UTIL{{gpu="{PHYSICAL_GPU}",UUID="{uuid}",pci_bus_id="x",hpc_job="{job}"}} 97\n'
    (g,) = map_samples(parse_exposition(page), "n1").gpus.values()
    return g.labels


@pytest.mark.parametrize(
    ("env", "slurm_job"),
    [(SLURM_CONSTRAINED, "1234"), (TORCHRUN_IN_SBATCH, "1234"), (ARRAY_TASK_RESTARTED, "1240")],
    ids=["srun-constrained", "torchrun-in-sbatch", "array-task-requeued"],
)
def test_one_rank_has_one_job_and_gpu_on_every_path(
    env: dict[str, str], slurm_job: str, tmp_path: Path
) -> None:
    fake = FakeNvml.healthy(8)
    cgroup = f"0::/system.slice/slurmstepd.scope/job_{slurm_job}/step_0/user/task_0\n"
    sdk = detect_placement(env, uuid_index=lambda: uuid_indices(fake))
    agent = agent_view(tmp_path, env, cgroup, fake)
    dcgm = dcgm_view(slurm_job, fake)
    assert sdk.job == agent["job"] == dcgm["job"] == slurm_job
    assert sdk.gpu == agent["gpu"] == dcgm["gpu"] == str(PHYSICAL_GPU)


def test_a_container_that_sees_its_gpu_by_uuid(tmp_path: Path) -> None:
    # NVIDIA container toolkit: the pod's one GPU is device 0 inside, its UUID in NVIDIA_VISIBLE_DEVICES
    fake = FakeNvml.healthy(8)
    uuid = fake.gpus[PHYSICAL_GPU].uuid
    env = {"GPUSCOPE_JOB": "llm", "NVIDIA_VISIBLE_DEVICES": uuid, "CUDA_VISIBLE_DEVICES": "0"}
    sdk = detect_placement(env, uuid_index=lambda: uuid_indices(fake))
    assert (sdk.gpu, sdk.gpu_uuid) == (str(PHYSICAL_GPU), uuid)
    agent = agent_view(tmp_path, env, "0::/\n", fake)
    assert agent["gpu"] == sdk.gpu and agent["job"] == "llm"
    # without NVML the UUID stands in for the index: never a wrong index
    assert detect_placement(env, uuid_index=dict).gpu == uuid


def test_kubeflow_pytorchjob_and_torchrun_defaults() -> None:
    kubeflow = {"MASTER_ADDR": "bert-ft-master-0", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "8", "RANK": "3"}
    assert job_key(kubeflow) == "bert-ft"
    assert detect_placement({**kubeflow, "WORLD_SIZE": "16"}, uuid_index=dict).job == "bert-ft"
    assert job_key({"TORCHELASTIC_RUN_ID": "none"}) is None
    assert job_key({"TORCHELASTIC_RUN_ID": "3f2a"}) == "3f2a"
    assert job_key({"MASTER_ADDR": "db-master-0"}) is None  # not a PyTorchJob without PET_*


def test_visible_devices_without_constraint_are_already_physical() -> None:
    env = {"SLURM_STEP_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert rank_gpu(env, 2).index == "6"
    constrained = {"SLURM_STEP_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert rank_gpu(constrained, 2).index == "6"
    assert rank_gpu({}, 3).index == "3"
