"""training_stalled and rank_lost: hangs and dead ranks found fast, job boundaries left alone."""

from __future__ import annotations

from collections.abc import Callable

from detect.rig import Driver, FakeCluster, FakeJob
from gpuscope.detect.training import TrainingLivenessDetector
from gpuscope.model import Batch, Event


def setup(nodes: int = 2, gpus: int = 4, **job_kw: object) -> tuple[FakeCluster, FakeJob, Driver]:
    cluster = FakeCluster(nodes=nodes, gpus=gpus)
    job = FakeJob.on(cluster.names, gpus, **job_kw)  # type: ignore[arg-type]
    cluster.allocate(job.name, job.placement)
    return cluster, job, Driver([TrainingLivenessDetector()])


def both(cluster: FakeCluster, job: FakeJob) -> Callable[[float], list[Batch | None]]:
    return lambda t: [*cluster.batches(t), job.batch(t)]


def test_hang_is_found_within_budget_and_says_the_gpus_are_busy() -> None:
    cluster, job, driver = setup()
    driver.run(0, 100, both(cluster, job))
    job.hung = True  # processes alive, heartbeating, no more steps; last step at 99
    driver.run(100, 130, both(cluster, job))
    alert = driver.only("training_stalled")
    assert alert.entity == {"job": "llm"} and alert.severity == "P1" and alert.owner == "model"
    assert 99 + 8 <= alert.started_at <= 99 + 10  # within max(3 x 1 s, 10 s) of the last step
    assert "busy" in alert.summary and alert.details["busy"] is True
    assert alert.cost_per_hour == 8 * 2.5  # the whole job: world size 8
    assert alert.details["links"] == [{"node": "node-0"}, {"node": "node-1"}]
    assert not driver.alerts_of("rank_lost")
    job.hung = False
    job.next_step_at = 131.0
    driver.run(130, 145, both(cluster, job))
    assert alert.resolved_at is not None and alert.resolved_at <= 137


def test_slow_steps_get_a_proportional_threshold() -> None:
    cluster, job, driver = setup(step_time=6.0)
    driver.run(0, 200, both(cluster, job))
    last_step = job.next_step_at - job.step_time
    job.hung = True
    driver.run(200, 240, both(cluster, job))
    alert = driver.only("training_stalled")
    assert last_step + 15 <= alert.started_at <= last_step + 18  # 2.5 x 6 s, within 3 x 6 s
    assert abs(alert.details["baseline_step_seconds"] - 6.0) < 1e-6


def test_initialisation_checkpoints_and_job_end_are_not_stalls() -> None:
    cluster, job, driver = setup(init=90.0, step_time=1.5)  # 90 s before the first step
    driver.run(0, 200, both(cluster, job))
    job.start_checkpoint(200.0, 45.0)  # first checkpoint: no history, 300 s allowance
    driver.run(200, 400, both(cluster, job))
    job.start_checkpoint(400.0, 100.0)  # longer than 2 x the first: still within max(3 x 45, 120)
    driver.run(400, 600, both(cluster, job))
    ended = job.end(600.0)
    cluster.free(job.name)
    driver.run(600, 700, lambda t: [*cluster.batches(t), ended if t == 600 else None])
    assert not driver.alerts.all()


def test_a_checkpoint_that_never_completes_is_a_stall_after_its_allowance() -> None:
    cluster, job, driver = setup()
    driver.run(0, 50, both(cluster, job))
    job.start_checkpoint(50.0, 10_000.0)
    driver.run(50, 400, both(cluster, job))
    alert = driver.only("training_stalled")
    assert 49 + 300 <= alert.started_at <= 49 + 302 and alert.details["in_checkpoint"]


def test_dead_rank_is_lost_fast_and_named_first_in_the_stall() -> None:
    cluster, job, driver = setup()
    driver.run(0, 60, both(cluster, job))
    job.dead.add(6)  # the process died: no heartbeats; the others block in the collective
    driver.run(60, 90, both(cluster, job))
    lost = driver.only("rank_lost")
    assert lost.entity == {"job": "llm", "rank": "6", "node": "node-1", "gpu": "2"}
    assert 63 <= lost.started_at <= 64 and lost.severity == "P1" and lost.owner == "platform"
    assert lost.cost_per_hour == 2.5
    stalled = driver.only("training_stalled")
    assert stalled.details["first_silent_rank"]["rank"] == 6
    assert "rank 6 on node-1 GPU 2 stopped heartbeating first" in stalled.summary
    assert stalled.details["links"] == [{"node": "node-1", "gpu": "2"}]
    job.dead.clear()  # restarted in place: heartbeats and steps come back
    job.next_step_at = 91.0
    driver.run(90, 100, both(cluster, job))
    assert lost.resolved_at is not None and 90 <= lost.resolved_at <= 96
    assert stalled.resolved_at is not None and 91 <= stalled.resolved_at <= 97


def test_rank_on_an_unreachable_node_is_still_lost() -> None:
    cluster, job, driver = setup()
    driver.run(0, 60, both(cluster, job))
    cluster.down.add("node-1")
    job.dead |= {4, 5, 6, 7}
    driver.run(60, 90, both(cluster, job))
    lost = sorted(int(a.entity["rank"]) for a in driver.alerts_of("rank_lost"))
    assert lost == [4, 5, 6, 7]
    assert all(a.started_at <= 64 for a in driver.alerts_of("rank_lost"))


def test_job_end_and_failure_leave_no_lost_ranks_even_when_the_end_event_lags() -> None:
    cluster, job, driver = setup()
    driver.run(0, 60, both(cluster, job))
    job.dead = {p[0] for p in job.placement}  # every process exits at once...
    driver.run(60, 70, both(cluster, job))
    ended = job.end(70.0)  # ...and the scheduler reports the end 10 s later
    cluster.free(job.name)
    driver.run(70, 120, lambda t: [*cluster.batches(t), ended if t == 70 else None])
    assert not driver.alerts.all()

    cluster, job, driver = setup()
    driver.run(0, 60, both(cluster, job))
    failed = job.end(60.0, failed=True)
    driver.run(60, 120, lambda t: [*cluster.batches(t), failed if t == 60 else None])
    assert not driver.alerts.all()


def test_whole_job_silence_without_an_end_event_is_eventually_lost() -> None:
    cluster, job, driver = setup(nodes=1, gpus=2)
    driver.run(0, 30, both(cluster, job))
    job.dead = {0, 1}
    driver.run(30, 60, both(cluster, job))
    assert sorted(a.started_at for a in driver.alerts_of("rank_lost")) == [48, 48]  # 4 s + 15 s grace


def test_a_job_silent_for_the_abandon_time_is_presumed_gone() -> None:
    cluster = FakeCluster(nodes=1, gpus=2)
    job = FakeJob.on(cluster.names, 2)
    driver = Driver([TrainingLivenessDetector(abandon_after=120.0)])
    driver.run(0, 30, both(cluster, job))
    job.dead = {0, 1}  # killed without any end event
    driver.run(30, 200, both(cluster, job))
    assert {a.rule for a in driver.alerts.all()} == {"rank_lost", "training_stalled"}
    assert all(a.resolved_at is not None and 149 <= a.resolved_at <= 156 for a in driver.alerts.all())
    assert driver.detection.stats()["jobs_presumed_gone"] == 1
    job.dead.clear()  # it was only cut off: it speaks again and is tracked again
    job.next_step_at = 201.0
    driver.run(200, 260, both(cluster, job))
    job.hung = True
    driver.run(260, 280, both(cluster, job))
    assert driver.alerts_of("training_stalled")[-1].started_at >= 260


def test_late_traffic_after_the_end_does_not_resurrect_the_job() -> None:
    cluster, job, driver = setup(nodes=1, gpus=2)
    driver.run(0, 30, both(cluster, job))
    ended = job.end(30.0)
    job.ended = False  # the ranks keep talking for a few seconds after the end event
    driver.tick(30, [ended, job.batch(30)])
    driver.run(31, 35, both(cluster, job))
    job.ended = True
    driver.run(35, 80, cluster.batches)
    assert not driver.alerts.all()
    assert driver.detection.stats()["training_traffic_after_job_end"] > 0


def test_hub_pause_raises_no_stall_or_lost_rank() -> None:
    cluster, job, driver = setup()
    driver.run(0, 60, both(cluster, job))
    driver.run(60, 120, lambda t: [])  # nothing arrives at all; steps "resume" on the job's own clock
    job.next_step_at = 121.0
    driver.run(120, 160, both(cluster, job))
    assert not driver.alerts.all()


def test_job_known_only_from_its_traffic_is_tracked() -> None:
    cluster, job, driver = setup(nodes=1, gpus=2)
    job.started_sent = True  # the hub started mid-job: no job_started seen
    driver.run(0, 40, both(cluster, job))
    job.hung = True
    driver.run(40, 60, both(cluster, job))
    assert driver.only("training_stalled").started_at <= 49


def test_malformed_training_events_are_counted() -> None:
    _, _, driver = setup()
    bad = Batch(
        "sdk",
        events=[
            Event(1.0, "heartbeat", {"job": "x", "rank": "-1"}),
            Event(1.0, "checkpoint_started", {"rank": "0"}),
            Event(
                1.0,
                "job_started",
                {"job": "y"},
                {"placement": [[0, "n"], ["a", "n", "0"]], "world_size": "two"},
            ),
        ],
    )
    driver.tick(1.0, [bad])
    stats = driver.detection.stats()
    assert stats["heartbeat_events_malformed"] == 1 and stats["checkpoint_started_events_malformed"] == 1
    assert stats["bad_job_events"] == 3


def test_a_stall_says_how_long_the_ranks_own_heartbeats_show_no_step_and_only_when_they_track_it() -> None:
    """``event_seconds_since_step``: what every rank's own heartbeats, in its own time, show of the
    stall (the evidence a hub behind on ingest may judge by, :mod:`gpuscope.gaps`). Heartbeats that
    do not follow the steps (always step 0) show nothing, however long they go on."""
    cluster, job, driver = setup()
    driver.run(0, 100, both(cluster, job))
    job.hung = True  # last step at 99, told by the heartbeat at 99
    driver.run(100, 120, both(cluster, job))
    stalled = driver.only("training_stalled")
    assert stalled.details["event_seconds_since_step"] == 119 - 99  # its ranks' latest heartbeat

    cluster, job, driver = setup()

    def steady_beats(t: float) -> list[Batch | None]:
        batch = job.batch(t)
        if batch is not None:
            for event in batch.events:
                if event.kind == "heartbeat":
                    event.data["step"] = 0
        return [*cluster.batches(t), batch]

    driver.run(0, 100, steady_beats)
    job.hung = True
    driver.run(100, 120, steady_beats)
    assert driver.only("training_stalled").details["event_seconds_since_step"] == 0.0
