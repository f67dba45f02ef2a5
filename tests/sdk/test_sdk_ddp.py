"""End to end on real PyTorch: 3 DDP ranks over gloo as real processes, a real hub process.

Healthy training raises nothing; a rank stuck before a collective stalls the job and is named;
a killed rank is lost with its node and GPU; a slowed rank arrives late; a
corrupted checkpoint file fails verification.
"""

from __future__ import annotations

import argparse
import signal
import statistics
from pathlib import Path
from typing import Any

import pytest

from sdk.ddp import PLACEMENT, DdpJob
from support import HubProcess, wait_until

pytest.importorskip("torch")
pytestmark = pytest.mark.integration


def _by_rank(records: list[dict[str, Any]], metric: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in records:
        value = r["metrics"].get(metric)
        if value is not None:
            out.setdefault(int(r["rank"]), []).append(float(value))
    return out


def _firing(job: DdpJob, rule: str) -> list[dict[str, Any]]:
    return [a for a in job.alerts() if a["rule"] == rule]


def test_healthy_run_reports_everything_and_raises_nothing(tmp_path: Path, sdk_hub: HubProcess) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job = DdpJob(tmp_path, sdk_hub.url, "ddp-healthy", "healthy", steps=24, CKPT_DIR=str(ckpt))
    try:
        assert job.wait(120) == {0: 0, 1: 0, 2: 0}, job.output()
    finally:
        job.kill()
    wait_until(lambda: job.events("job_ended"), 10, "the job's end")
    # every rank ships its last records as it exits, which may be after rank 0's job_ended
    wait_until(lambda: len(job.records()) >= 24 * len(PLACEMENT), 15, "every rank's last records")
    records = job.records()
    steps = {rank: sorted(int(r["step"]) for r in records if r["rank"] == rank) for rank in PLACEMENT}
    counts = {rank: {k: s.count(k) for k in set(s) if s.count(k) != 1} for rank, s in steps.items()}
    assert all(s == list(range(24)) for s in steps.values()), counts  # one record per rank per step
    for r in records:
        node, local = PLACEMENT[int(r["rank"])]
        assert r["labels"] == {"node": node, "gpu": str(local)}
    loss = _by_rank(records, "loss")
    assert all(len(v) == 24 for v in loss.values())
    for metric in ("step_seconds", "grad_norm", "collective_wait_seconds", "samples_per_second", "mfu_ratio"):
        assert set(_by_rank(records, metric)) == {0, 1, 2}, metric
    assert len(_by_rank(records, "collective_arrival_gap_seconds")[1]) >= 20
    # gradient norms are each rank's own (measured before the all-reduce), so they differ
    norms = _by_rank(records, "grad_norm")
    assert norms[0][3] != norms[1][3]
    beats = job.events("heartbeat")
    assert {e["labels"]["rank"] for e in beats} == {"0", "1", "2"}
    assert all("step" in e["data"] for e in beats)
    assert {e["labels"]["rank"] for e in beats if e["data"].get("collective_seq", 0) > 0} == {"0", "1", "2"}
    started = job.events("job_started")
    assert len(started) == 1 and started[0]["data"]["world_size"] == 3
    done = job.events("checkpoint_completed")
    assert sorted(e["labels"]["rank"] for e in done) == ["0", "1", "2"]  # complete across ranks
    assert all(e["data"]["step"] == 12 and e["data"]["seconds"] > 0 for e in done)
    goodput = job.events("job_ended")[0]["data"]["goodput"]
    assert 0 < goodput["goodput_ratio"] < 1 and goodput["badput_checkpoint_seconds_total"] > 0
    assert job.alerts() == []

    # a corrupted checkpoint file fails verification, from the command line and as an event
    from gpuscope.sdk import verify

    step_dir = ckpt / "step-12"
    args = argparse.Namespace(path=step_dir, json=True, hub=sdk_hub.url, token=None)
    assert verify.run(args) == 0
    shard = max((p for p in step_dir.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify.run(args) == 1
    verified = job.events("checkpoint_verified")
    assert any(e["data"]["ok"] is False and e["data"]["problems"][0]["what"] == "sha256" for e in verified)


def test_rank_stuck_before_a_collective_stalls_the_job_and_is_named(
    tmp_path: Path, sdk_hub: HubProcess
) -> None:
    job = DdpJob(tmp_path, sdk_hub.url, "ddp-hang", "hang", steps=200, FAULT_RANK="2", FAULT_STEP="8")
    try:
        # the wait includes three ranks importing torch and joining the process group: 120 s, like a whole run
        wait_until(lambda: _firing(job, "training_stalled"), 120, "training_stalled", interval=0.5)
        alert = _firing(job, "training_stalled")[0]
        assert alert["entity"] == {"job": "ddp-hang"}
        late = alert["details"]["late_ranks"]
        assert [(r["rank"], r["node"], r["gpu"]) for r in late] == [(2, "node-b", "0")]
        assert "rank(s) 2 (node-b GPU 0) never arrived" in alert["summary"]
        assert not _firing(job, "rank_lost")  # alive: heartbeats go on
    finally:
        job.kill()


def test_killed_rank_is_lost_with_its_node_and_gpu(tmp_path: Path, sdk_hub: HubProcess) -> None:
    job = DdpJob(tmp_path, sdk_hub.url, "ddp-kill", "kill", steps=200, FAULT_RANK="2", FAULT_STEP="6")
    try:
        wait_until(lambda: _firing(job, "rank_lost"), 120, "rank_lost", interval=0.5)
        lost = _firing(job, "rank_lost")
        assert [a["entity"] for a in lost] == [{"job": "ddp-kill", "rank": "2", "node": "node-b", "gpu": "0"}]
        assert job.wait_rank(2, 5) == -signal.SIGKILL
    finally:
        job.kill()


def test_slowed_rank_arrives_late_at_every_step(tmp_path: Path, sdk_hub: HubProcess) -> None:
    job = DdpJob(tmp_path, sdk_hub.url, "ddp-slow", "slow", steps=16, FAULT_RANK="1", FAULT_STEP="0")
    try:
        assert job.wait(120) == {0: 0, 1: 0, 2: 0}, job.output()
    finally:
        job.kill()
    wait_until(lambda: job.events("job_ended"), 10, "the job's end")
    records = job.records()
    gap = {
        rank: statistics.median(v) for rank, v in _by_rank(records, "collective_arrival_gap_seconds").items()
    }
    assert gap[1] > gap[0] + 0.1 and gap[1] > gap[2] + 0.1, gap
    # duration alone blames the others: they waited for rank 1
    wait = {rank: statistics.median(v) for rank, v in _by_rank(records, "collective_wait_seconds").items()}
    assert wait[0] > wait[1] + 0.1 and wait[2] > wait[1] + 0.1, wait
