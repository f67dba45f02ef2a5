"""Placement from launcher environments: torchrun, Slurm, Kubernetes, and gpuscope's overrides."""

from __future__ import annotations

import pytest

from gpuscope.sdk.env import PlacementError, detect_placement, hub_from_env


def test_torchrun() -> None:
    env = {"TORCHELASTIC_RUN_ID": "llm", "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "NODE_NAME": "n3"}
    p = detect_placement(env, gpu_present=lambda: True)
    assert (p.job, p.rank, p.local_rank, p.world_size, p.node, p.gpu) == ("llm", 5, 1, 8, "n3", "1")
    assert p.labels == {"job": "llm", "rank": "5", "node": "n3", "gpu": "1"}


def test_slurm_job_is_its_id_and_gpu_comes_from_visible_devices() -> None:
    env = {
        "SLURM_JOB_NAME": "pretrain",
        "SLURM_JOB_ID": "4411",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "3",
        "SLURM_NTASKS": "4",
        "SLURMD_NODENAME": "gpu-07",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    }
    p = detect_placement(env)
    # the id, as the agent (cgroup job_<id>) and dcgm-exporter (hpc_job) name it too
    assert (p.job, p.rank, p.world_size, p.node, p.gpu) == ("4411", 3, 4, "gpu-07", "7")
    assert detect_placement({**env, "CUDA_VISIBLE_DEVICES": "2"}).gpu == "2"  # one GPU pinned per process


def test_explicit_arguments_and_gpuscope_variables_win() -> None:
    env = {"GPUSCOPE_JOB": "mine", "TORCHELASTIC_RUN_ID": "theirs", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect_placement(env).job == "mine"
    assert detect_placement(env, job="given", rank=0, node="x", gpu=3).labels == {
        "job": "given",
        "rank": "0",
        "node": "x",
        "gpu": "3",
    }
    assert hub_from_env({"GPUSCOPE_HUB": "http://h:7470", "GPUSCOPE_TOKEN": "t"}) == ("http://h:7470", "t")


def test_a_rank_without_a_gpu_carries_no_gpu_label() -> None:
    """Seen: a CPU-only torchrun rank was alerted as "rank 2 on node-1 GPU 2"."""
    env = {"GPUSCOPE_JOB": "cpu", "RANK": "2", "WORLD_SIZE": "3", "NODE_NAME": "node-1"}
    no_driver = detect_placement(env, gpu_present=lambda: False)
    assert no_driver.gpu is None and no_driver.gpu_uuid is None
    assert no_driver.labels == {"job": "cpu", "rank": "2", "node": "node-1"}
    for hidden in ("", "-1", "-1,0", "NoDevFiles"):  # CUDA hides every device
        placed = detect_placement({**env, "CUDA_VISIBLE_DEVICES": hidden}, gpu_present=lambda: True)
        assert placed.gpu is None, hidden
    for cpu in ("cpu", "", "CPU"):  # gpuscope.init(gpu="cpu")
        assert detect_placement(env, gpu=cpu, gpu_present=lambda: True).gpu is None
    # a GPU the environment names needs no driver check (asked only when nothing names one)
    named = detect_placement({**env, "CUDA_VISIBLE_DEVICES": "5"}, gpu_present=lambda: False)
    assert named.gpu == "5"
    assert detect_placement(env, gpu_present=lambda: True).gpu == "2"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no job name"),
        ({"GPUSCOPE_JOB": "j", "RANK": "two"}, "RANK='two' is not an integer"),
        ({"GPUSCOPE_JOB": "j", "RANK": "4", "WORLD_SIZE": "4"}, "does not fit"),
        ({"GPUSCOPE_JOB": "j", "RANK": "-1"}, "must not be negative"),
    ],
)
def test_bad_environments_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        detect_placement(env)
