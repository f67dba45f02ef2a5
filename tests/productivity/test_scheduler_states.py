"""Nodes the scheduler holds out of service (the Slurm collector's node states, from a capture of
Debian's slurm-wlm 22.05.8: node n1 ``mixed`` with the ``DRAIN`` flag, two GPUs) count as down GPU
time, cause ``draining``, for the GPUs that compute nothing (a draining node finishes its jobs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpuscope.collect.slurm import SlurmCollector
from gpuscope.model import Batch, Frame
from gpuscope.productivity import ProductivityModel
from gpuscope.productivity.ledger import HOUR
from gpuscope.productivity.model import SCHEDULER_STALE_S

FIXTURES = Path(__file__).parents[1] / "collect" / "fixtures" / "slurm"
SQUEUE = (FIXTURES / "squeue-22.05.json").read_text()
DRAINED = (FIXTURES / "sinfo-22.05-drained.json").read_text()


def back_in_service(sinfo: str) -> str:
    doc = json.loads(sinfo)
    for node in doc["nodes"]:
        node["state"], node["state_flags"] = "idle", []
    return json.dumps(doc)


def slurm_says(model: ProductivityModel, sinfo: str, now: float) -> None:
    pages = {"squeue": SQUEUE, "sinfo": sinfo}
    collected = SlurmCollector("login-1", run=lambda argv: pages[argv[0]]).collect(now)
    model.observe(Batch("login-1", frames=collected.frames))


def gpus(ts: float, busy_job: bool = True) -> Frame:
    # n1's GPU 0 runs a job to its end (a draining node keeps its jobs), GPU 1 has no work
    first = {"node": "n1", "gpu": "0", **({"job": "chat"} if busy_job else {})}
    entities = [first, {"node": "n1", "gpu": "1"}]
    return Frame(ts, ["gpu_utilization_percent"], entities, np.array([[97.0], [0.0]]))


def seconds(model: ProductivityModel, start: float, end: float) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for group in model.summary("fleet", start, end)["groups"]:
        for state, row in group["states"].items():
            for cause, c in row["causes"].items():
                out[state, cause] = c["gpu_hours"] * HOUR
    return out


def test_a_drained_slurm_node_counts_its_idle_gpus_down_while_its_jobs_finish() -> None:
    model = ProductivityModel()
    for t in range(0, 121):
        if t % 30 == 0:  # the Slurm collector's round
            slurm_says(model, DRAINED if t < 60 else back_in_service(DRAINED), float(t))
        model.observe(Batch("n1", frames=[gpus(float(t))]))
        model.advance(float(t), [])
    got = seconds(model, 0.0, 120.0)
    assert math.isclose(got["down", "draining"], 60.0, abs_tol=1.0), got  # GPU 1 while drained
    assert math.isclose(got["idle_unallocated", "no_job"], 60.0, abs_tol=1.0), got  # then free again
    assert math.isclose(got["productive", "serving"], 120.0, abs_tol=1.0), got  # GPU 0 throughout
    assert {g["gpu"]: g["cause"] for g in model.gpu_states()} == {"0": "serving", "1": "no_job"}
    assert model.gpu_states()[1]["owner"] == "platform"


def test_a_silent_gpu_of_a_held_out_node_is_draining_and_the_word_of_a_silent_scheduler_expires() -> None:
    model = ProductivityModel()
    slurm_says(model, DRAINED, 0.0)
    for t in range(0, 11):
        model.observe(Batch("n1", frames=[gpus(float(t), busy_job=False)]))
        model.advance(float(t), [])
    model.advance(100.0, [])  # n1 goes silent: down, and the scheduler says why
    assert {g["cause"] for g in model.gpu_states()} == {"draining"}
    for t in range(101, 111):  # back: the idle GPU is still held out, the busy one computes
        model.observe(Batch("n1", frames=[gpus(float(t), busy_job=False)]))
    assert {g["gpu"]: g["cause"] for g in model.gpu_states()} == {"0": "unattributed", "1": "draining"}
    # the scheduler's word holds SCHEDULER_STALE_S: a scheduler gone silent holds nothing out after it
    late = SCHEDULER_STALE_S + 200.0
    model.observe(Batch("n1", frames=[gpus(late, busy_job=False)]))
    assert {g["gpu"]: g["cause"] for g in model.gpu_states()} == {"0": "unattributed", "1": "no_job"}
