"""The scheduler's view from Slurm's own JSON: a capture of Debian's slurm-wlm 22.05.8 (squeue and
sinfo --json, openapi/v0.0.38; tests/collect/fixtures/slurm) and the 23.02+ data_parser shape
(SchedMD/slurm src/plugins/data_parser/v0.0.40: numbers as {"set", "infinite", "number"}, state
lists, an exit-code object)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuscope.collect.nvml import frame
from gpuscope.collect.slurm import SlurmCollector, exit_code, parse_jobs, parse_nodes
from gpuscope.detect.queue import QueueDetector
from gpuscope.model import Frame
from gpuscope.signals import SCHEDULER_METRICS

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
SQUEUE = (FIXTURES / "squeue-22.05.json").read_text()
SINFO = (FIXTURES / "sinfo-22.05-drained.json").read_text()


def runner(pages: dict[str, str]) -> Callable[[list[str]], str]:
    def run(argv: list[str]) -> str:
        return pages[argv[0]]

    return run


def rows(frames: list[Frame], key: str) -> dict[str, dict[str, float]]:
    out = {}
    for f in frames:
        for i, labels in enumerate(f.entities):
            if key in labels and (key != "partition" or "job_id" not in labels):
                out[labels[key]] = {
                    m: float(f.values[i, j])
                    for j, m in enumerate(f.metrics)
                    if f.values[i, j] == f.values[i, j]
                }
    return out


def test_the_22_05_capture_parses() -> None:
    jobs = {j.job_id: j for j in parse_jobs(json.loads(SQUEUE))}
    assert (jobs["1"].state, jobs["1"].gpus, jobs["1"].start - jobs["1"].submit) == ("RUNNING", 1, 1.0)
    assert (jobs["2"].state, jobs["2"].reason, jobs["2"].exit_code) == ("FAILED", "NonZeroExitCode", 3)
    assert (jobs["3"].state, jobs["3"].reason, jobs["3"].gpus, jobs["3"].start) == (
        "PENDING",
        "Resources",
        2,
        None,
    )
    (node,) = parse_nodes(json.loads(SINFO))
    assert node.name == "n1" and node.gpus == 2 and node.unavailable and node.reason == "fan replaced"


def test_the_collector_raises_job_failed_once_and_reports_queue_and_capacity() -> None:
    submit = json.loads(SQUEUE)["jobs"][2]["submit_time"]
    c = SlurmCollector("login-1", run=runner({"squeue": SQUEUE, "sinfo": SINFO}))
    got = c.collect(submit + 3600.0)
    (failed,) = got.events
    assert failed.kind == "job_failed" and failed.labels == {"job": "2"}
    assert failed.data["exit_code"] == 3 and failed.data["reason"] == "NonZeroExitCode"
    assert failed.data["source"] == "slurm" and failed.data["state"] == "FAILED"
    part = rows(got.frames, "partition")["debug"]
    assert part["slurm_jobs_pending"] == 1 and part["slurm_gpus_pending"] == 2
    assert part["slurm_jobs_running"] == 1 and part["slurm_gpus_running"] == 1
    assert part["slurm_gpus_total"] == 2 and part["slurm_gpus_unavailable"] == 2
    assert part["slurm_oldest_pending_seconds"] == pytest.approx(3600.0)
    jobs = rows(got.frames, "job_id")
    assert jobs["3"]["slurm_job_pending_seconds"] == pytest.approx(3600.0)
    assert jobs["1"]["slurm_job_queue_wait_seconds"] == 1.0
    assert rows(got.frames, "node")["n1"] == {"slurm_node_unavailable": 1.0, "slurm_node_gpus": 2.0}
    assert c.collect(submit + 3700.0).events == []  # reported once


NEW_SHAPE = {
    "jobs": [
        {
            "job_id": 88,
            "name": "pretrain",
            "partition": "gpu",
            "job_state": ["OUT_OF_MEMORY"],
            "state_reason": "OutOfMemory",
            "submit_time": {"set": True, "infinite": False, "number": 1000},
            "start_time": {"set": True, "infinite": False, "number": 1100},
            "end_time": {"set": True, "infinite": False, "number": 5000},
            "exit_code": {
                "status": ["SIGNALED"],
                "return_code": {"set": True, "infinite": False, "number": 0},
                "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"},
            },
            "node_count": {"set": True, "infinite": False, "number": 2},
            "tres_per_node": "gres/gpu:8",
            "array_job_id": {"set": True, "infinite": False, "number": 80},
            "restart_cnt": {"set": True, "infinite": False, "number": 1},
        }
    ]
}


def test_the_23_02_shape_parses_the_same_way() -> None:
    (job,) = parse_jobs(NEW_SHAPE)
    assert (job.state, job.gpus, job.exit_code, job.signal) == ("OUT_OF_MEMORY", 16, 0, 9)
    assert (job.array_job_id, job.restarts, job.end) == ("80", 1, 5000.0)
    (node,) = parse_nodes(
        {"nodes": [{"name": "g1", "state": ["IDLE", "DRAIN"], "gres": "gpu:h100:8(S:0-1)"}]}
    )
    assert node.unavailable and node.gpus == 8
    assert exit_code(768) == (3, None) and exit_code(9) == (0, 9)


def test_a_broken_command_is_an_error_of_that_round() -> None:
    def run(argv: list[str]) -> str:
        if argv[0] == "sinfo":
            raise RuntimeError("sinfo --json exited 1: Unable to contact slurm controller")
        return "not json"

    with pytest.raises(RuntimeError, match="Unable to contact"):
        SlurmCollector("n", run=run).collect(1.0)
    got = SlurmCollector("n", run=runner({"squeue": '{"jobs": []}', "sinfo": "[1]"})).collect(1.0)
    assert [e.kind for e in got.errors] == ["slurm_format"]


def _job_frame(ts: float, rows_: list[tuple[dict[str, str], dict[str, float]]]) -> Frame:
    f = frame(ts, SCHEDULER_METRICS, rows_)
    assert f is not None
    return f


def test_job_pending_too_long_judges_against_the_partition_s_usual_wait() -> None:
    det = QueueDetector(factor=3.0, floor=600.0, min_started=5)
    started = [
        ({"partition": "gpu", "job_id": str(i)}, {"slurm_job_queue_wait_seconds": 300.0 + 10 * i})
        for i in range(10)
    ]
    det.on_frame(_job_frame(100.0, started))
    assert det.limit("gpu") == pytest.approx(3 * 381.0)  # 3 x p90 of 300..390
    pending = [
        ({"partition": "gpu", "job_id": "50", "reason": "Resources"}, {"slurm_job_pending_seconds": 5000.0}),
        ({"partition": "gpu", "job_id": "51", "reason": "Priority"}, {"slurm_job_pending_seconds": 600.0}),
        ({"partition": "gpu", "job_id": "52", "reason": "Dependency"}, {"slurm_job_pending_seconds": 9000.0}),
        ({"partition": "cpu", "job_id": "60", "reason": "Resources"}, {"slurm_job_pending_seconds": 5000.0}),
    ]
    det.on_frame(_job_frame(200.0, pending))
    (f,) = det.evaluate(200.0)
    assert f.rule == "job_pending_too_long" and f.entity == {"partition": "gpu", "job_id": "50"}
    assert f.details["reason"] == "Resources"
    # it starts: the finding clears and its wait joins the baseline
    det.on_frame(
        _job_frame(300.0, [({"partition": "gpu", "job_id": "50"}, {"slurm_job_queue_wait_seconds": 5100.0})])
    )
    assert det.evaluate(300.0) == []
    # a partition with no history judges by the cold limit only
    assert det.limit("cpu") == det.cold_limit
