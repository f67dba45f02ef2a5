"""Whole-cluster scenarios through every detector: a healthy day raises nothing serious, hard faults
are found within budget, and one fault's alerts form one incident rooted at the hardware."""

from __future__ import annotations

import math
import random

from detect.rig import Driver, FakeCluster, FakeJob
from gpuscope.model import Batch


def test_healthy_cluster_raises_no_p1_or_p2() -> None:
    """Noise, jitter, warm-up, checkpoints, a job ending, an idle gap, the next job, diurnal
    inference load and thermal blips: none of it is a fault."""
    rng = random.Random(11)
    cluster = FakeCluster(nodes=4, gpus=8, jitter=0.5, noise=2.0, seed=5)
    first = FakeJob.on(["node-0", "node-1"], 8, name="pretrain", step_time=1.2, init=20.0)
    second = FakeJob.on(["node-0", "node-1"], 8, name="finetune", step_time=0.8, init=15.0, start=640.0)
    other = FakeJob.on(["node-2"], 8, name="sweep", step_time=2.5, init=40.0)
    chat = [("node-3", str(g)) for g in range(4)]
    for key in chat:
        cluster.jobs[key] = "chat"
    for job in (first, other):
        cluster.allocate(job.name, job.placement)
    driver = Driver()
    extra: list[Batch] = []

    def ticks(t: float) -> list[Batch | None]:
        load = 0.5 + 0.4 * math.sin(2 * math.pi * t / 900)  # a compressed day
        for key in chat:
            cluster.overrides[key] = {
                "gpu_utilization_percent": 100 * load,
                "gpu_temp_celsius": 40 + 30 * load,
            }
        for key in [k for k, v in cluster.overrides.items() if "gpu_throttle_sw_thermal" in v]:
            del cluster.overrides[key]
        if rng.random() < 0.05:  # a one-second thermal blip somewhere
            key = (f"node-{rng.randrange(3)}", str(rng.randrange(8)))
            cluster.overrides[key] = {"gpu_throttle_sw_thermal": 1.0}
        if t in (150.0, 420.0):
            first.start_checkpoint(t, 35.0 if t == 150 else 70.0)
        if t == 300.0:
            other.start_checkpoint(t, 50.0)
        if t == 600.0:
            extra.append(first.end(t))
            cluster.free(first.name)
        if t == 640.0:
            cluster.allocate(second.name, second.placement)
        if t == 1000.0:
            extra.append(other.end(t, failed=False))
            cluster.free(other.name)
        out: list[Batch | None] = [
            *cluster.batches(t),
            first.batch(t),
            second.batch(t),
            other.batch(t),
            *extra,
        ]
        extra.clear()
        return out

    driver.run(0, 1200, ticks)
    assert not driver.serious(), [a.to_dict() for a in driver.serious()]
    assert first.step > 300 and second.step > 500 and other.step > 300  # the jobs really ran


def test_hard_faults_are_detected_within_the_time_budget() -> None:
    cluster = FakeCluster(nodes=6, gpus=8, jitter=0.3, seed=2)
    job = FakeJob.on(["node-4", "node-5"], 8, name="llm", step_time=1.1)
    cluster.allocate(job.name, job.placement)
    driver = Driver()
    onset: dict[str, float] = {}

    def ticks(t: float) -> list[Batch | None]:
        if t == 100:
            cluster.event(100.0, "xid", "node-0", "1", code=79)
            cluster.missing.add(("node-0", "1"))
            onset["gpu_xid_fatal"] = onset["gpu_lost"] = 100.0
        if t == 160:
            cluster.event(160.0, "ecc_dbe", "node-1", "4", count=1)
            cluster.overrides[("node-1", "4")] = {"gpu_ecc_dbe_volatile_total": 1.0}
            onset["gpu_ecc_uncorrectable"] = 160.0
        if t == 220:
            cluster.down.add("node-2")
            onset["node_unreachable"] = 220.0
        if t == 280:
            job.dead.add(11)
            onset["rank_lost"] = 280.0
        return [*cluster.batches(t), job.batch(t)]

    driver.run(0, 340, ticks)
    ttd = {rule: driver.alerts_of(rule)[0].started_at - at for rule, at in onset.items()}
    assert all(0 <= d <= 5 for d in ttd.values()), ttd
    assert driver.only("rank_lost").entity == {"job": "llm", "rank": "11", "node": "node-5", "gpu": "3"}
    assert driver.only("node_unreachable").entity == {"node": "node-2"}


def test_lost_gpu_its_rank_and_the_stalled_job_are_one_incident_rooted_at_the_gpu() -> None:
    cluster = FakeCluster(nodes=3, gpus=4)
    job = FakeJob.on(["node-0", "node-1"], 4, name="llm", step_time=1.0)
    cluster.allocate(job.name, job.placement)
    driver = Driver()
    driver.run(0, 60, lambda t: [*cluster.batches(t), job.batch(t)])
    cluster.event(60.0, "gpu_lost", "node-1", "2", reason="fell off the bus")
    cluster.missing.add(("node-1", "2"))
    job.dead.add(6)  # rank 6 ran on node-1 GPU 2
    driver.run(60, 80, lambda t: [*cluster.batches(t), job.batch(t)])
    cluster.down.add("node-2")  # an unrelated fault on a node the job does not use
    driver.run(80, 100, lambda t: [*cluster.batches(t), job.batch(t)])

    gpu = driver.only("gpu_lost")
    rank = driver.only("rank_lost")
    stalled = driver.only("training_stalled")
    node = driver.only("node_unreachable")
    assert gpu.started_at < rank.started_at < stalled.started_at
    assert gpu.incident == rank.incident == stalled.incident != node.incident
    incidents = {i.id: i for i in driver.alerts.incidents()}
    main = incidents[gpu.incident or ""]
    assert main.root == gpu.id and set(main.members) == {gpu.id, rank.id, stalled.id}
    assert main.title.startswith("gpu_lost on node-1 GPU 2") and main.resolved_at is None
    assert incidents[node.incident or ""].members == [node.id]
