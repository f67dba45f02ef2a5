"""The productivity model: each GPU-second gets one state, cause and owner, from what the hub hears."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from gpuscope import procmem
from gpuscope.model import Alert, Batch, Event, Frame, TrainingRecord
from gpuscope.productivity import ProductivityModel
from gpuscope.productivity.ledger import HOUR, MINUTES_KEPT_S

GPUS = 4


def frame(
    ts: float, node: str = "node-0", util: float = 99.0, job: str | None = "train", gpus: int = GPUS
) -> Frame:
    entities = [{"node": node, "gpu": str(g), **({"job": job} if job else {})} for g in range(gpus)]
    values = np.array([[util, 0.0] for _ in range(gpus)])
    return Frame(ts, ["gpu_utilization_percent", "gpu_throttle_hw_slowdown"], entities, values)


def step_records(ts: float, step: int, seconds: float = 1.0, ranks: int = GPUS) -> list[TrainingRecord]:
    return [
        TrainingRecord(ts, "train", r, step, {"step_seconds": seconds}, {"node": "node-0", "gpu": str(r)})
        for r in range(ranks)
    ]


def beats(ts: float, ranks: range) -> list[Event]:
    return [Event(ts, "heartbeat", {"job": "train", "rank": str(r)}) for r in ranks]


def started(ts: float, **data: object) -> Batch:
    return Batch("sdk", events=[Event(ts, "job_started", {"job": "train"}, dict(data))])


def seconds_by_cause(model: ProductivityModel, start: float = 0.0, end: float = 1e6) -> dict[str, float]:
    out: dict[str, float] = {}
    for group in model.summary("fleet", start, end)["groups"]:
        for state in group["states"].values():
            for cause, row in state["causes"].items():
                out[cause] = out.get(cause, 0.0) + row["gpu_hours"] * HOUR
    return out


def run_training(model: ProductivityModel, until: float, *, steps_until: float, step_s: float = 1.0) -> None:
    """A job that starts at 0, steps every ``step_s`` until ``steps_until``, its GPUs busy throughout."""
    model.observe(started(0.0))
    step = 0
    for t in range(1, int(until) + 1):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts)]))
        records = []
        if 5 <= ts <= steps_until and (ts - 5) % step_s == 0:
            step += 1
            records = step_records(ts, step, step_s)
        model.observe(Batch("sdk", training=records, events=beats(ts, range(GPUS))))
        model.advance(ts, [])


def test_a_stall_is_counted_busy_not_productive_while_it_happens() -> None:
    model = ProductivityModel(price_per_gpu_hour=3.6)
    run_training(model, 200.0, steps_until=100.0)
    causes = seconds_by_cause(model)
    # steps stop at 100 s; after 10 s of silence (5 step times, at least 10 s) the GPUs are hung,
    # and the seconds since the last step are recounted as hung
    assert math.isclose(causes["hung"], GPUS * 100.0, abs_tol=GPUS * 1.0), causes
    # start-up ends when the first step began (at 4 s: it took 1 s and was reported at 5 s)
    assert math.isclose(causes["startup"], GPUS * 3.0, abs_tol=GPUS * 0.5), causes
    assert model.job_status("train", 200.0) == "stalled"
    states = {g["state"] for g in model.gpu_states()}
    assert states == {"busy_not_productive"}
    row = model.summary("job", 0.0, 1e6)["groups"][0]
    assert row["group"] == "train"
    assert row["states"]["busy_not_productive"]["causes"]["hung"]["owner"] == "model"
    # 1 $/GPU-second: dollars are GPU-hours at the configured price
    assert math.isclose(
        row["states"]["busy_not_productive"]["dollars"],
        causes["hung"] / 1000 + causes["startup"] / 1000,
        rel_tol=0.02,
    )


def test_a_rank_that_goes_silent_turns_the_stall_into_a_collective_wait() -> None:
    model = ProductivityModel()
    model.observe(started(0.0))
    for t in range(1, 80):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts)]))
        records = step_records(ts, t) if ts <= 40 else []
        alive = range(GPUS) if ts <= 40 else range(1, GPUS)
        model.observe(Batch("sdk", training=records, events=beats(ts, alive)))
        model.advance(ts, [])
    assert seconds_by_cause(model)["collective_wait"] > 0
    assert model.job_status("train", 80.0) == "stalled"


def test_slower_steps_are_degraded_with_the_lost_fraction() -> None:
    model = ProductivityModel()
    model.observe(started(0.0))
    step = 0
    for t in range(1, 301):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts)]))
        step_s = 1.0 if ts <= 150 else 2.0
        records: list[TrainingRecord] = []
        if ts <= 150 or ts % 2 == 0:
            step += 1
            records = step_records(ts, step, step_s)
        model.observe(Batch("sdk", training=records))
        model.advance(ts, [])
    fleet = model.summary("fleet", 0.0, 1e6)["groups"][0]
    degraded = fleet["states"]["degraded"]
    assert degraded["gpu_hours"] * HOUR > GPUS * 140
    assert math.isclose(degraded["lost_gpu_hours"] / degraded["gpu_hours"], 0.5, abs_tol=0.02)
    assert model.job_status("train", 300.0) == "degraded"


def test_a_silent_gpu_is_down_from_its_last_frame_and_a_silent_node_is_unreachable() -> None:
    model = ProductivityModel()
    for t in range(1, 61):
        ts = float(t)
        gpus = GPUS if ts <= 20 else GPUS - 1  # GPU 3 falls off the bus at 20 s
        model.observe(Batch("node-0", frames=[frame(ts, job=None, util=0.0, gpus=gpus)]))
        if ts <= 30:
            model.observe(Batch("node-1", frames=[frame(ts, node="node-1", job=None, util=0.0)]))
        model.advance(ts, [])
    causes = seconds_by_cause(model)
    assert math.isclose(causes["lost_gpu"], 40.0, abs_tol=1.0), causes
    assert math.isclose(causes["node_unreachable"], GPUS * 30.0, abs_tol=GPUS), causes
    stale = {(g["node"], g["gpu"]) for g in model.gpu_states() if g["stale"]}
    assert stale == {("node-0", "3")} | {("node-1", str(g)) for g in range(GPUS)}


def test_a_fatal_xid_alert_marks_its_gpu_down_and_a_drained_node_is_maintenance() -> None:
    model = ProductivityModel()
    xid = Alert(
        "al-1", "gpu_xid_fatal", "P1", "platform", {"node": "node-0", "gpu": "1"}, 10.0, "XID 79", 2.5
    )
    model.drain("node-1", until=40.0, reason="firmware upgrade", by="ops")
    for t in range(1, 61):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts, job=None, util=0.0)]))
        model.observe(Batch("node-1", frames=[frame(ts, node="node-1", job=None, util=0.0)]))
        model.advance(ts, [xid] if ts >= 10 else [])
    causes = seconds_by_cause(model)
    assert math.isclose(causes["fatal_xid"], 50.0, abs_tol=1.0), causes
    assert math.isclose(causes["drained"], GPUS * 39.0, abs_tol=GPUS), causes
    assert model.active_drains() == []  # the drain ran out at 40 s


def test_idle_allocated_and_unallocated_and_grouping_by_node_team_and_service() -> None:
    model = ProductivityModel()
    model.observe(Batch("sdk", events=[Event(0.0, "job_started", {"job": "train"}, {"team": "llm"})]))
    for t in range(1, 31):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts, util=0.0)]))  # allocated, computing nothing
        model.observe(Batch("node-1", frames=[frame(ts, node="node-1", job="chat", util=60.0)]))
        model.observe(Batch("node-2", frames=[frame(ts, node="node-2", job=None, util=0.0)]))
        svc = Frame(
            ts, ["service_requests_total"], [{"service": "chat", "node": "node-1"}], np.array([[1.0]])
        )
        model.observe(Batch("svc", frames=[svc]))
        model.advance(ts, [])
    by_node = {r["group"]: r for r in model.summary("node", 0.0, 1e6)["groups"]}
    assert by_node["node-0"]["states"]["idle_allocated"]["gpu_hours"] > 0
    assert by_node["node-2"]["states"]["idle_unallocated"]["gpu_hours"] > 0
    # node-0's idle allocated GPUs are waste; node-1 serving is productive
    assert model.summary("node", 0.0, 1e6)["groups"][0]["group"] == "node-0"
    assert by_node["node-1"]["waste"]["gpu_hours"] == 0
    teams = {r["group"] for r in model.summary("team", 0.0, 1e6)["groups"]}
    assert teams == {"llm"}
    services = {r["group"]: r for r in model.summary("service", 0.0, 1e6)["groups"]}
    assert services["chat"]["states"]["productive"]["causes"]["serving"]["owner"] == "serving"


def test_rollups_fold_minutes_into_hours_and_keep_the_totals() -> None:
    model = ProductivityModel()
    end = MINUTES_KEPT_S + 3 * HOUR
    for t in range(60, int(end) + 1, 60):
        model.observe(Batch("node-0", frames=[frame(float(t), job=None, util=0.0)]))
    model.advance(end, [])
    assert model.ledger.hours, "old minutes were folded into hour buckets"
    assert min(model.ledger.minutes) * 60 >= end - MINUTES_KEPT_S - 60
    total = model.summary("fleet", 0.0, end)["groups"][0]["gpu_hours"]
    assert math.isclose(total, GPUS * (end - 60) / HOUR, rel_tol=1e-4)


def test_a_gpu_clocked_down_slows_its_whole_job_from_the_first_steps() -> None:
    model = ProductivityModel()
    model.observe(started(0.0))
    for t in range(1, 61):
        ts = float(t)
        clocks = [1980.0, 1980.0, 1980.0, 1980.0 if ts <= 30 else 1386.0]  # GPU 3 at 70 % from 30 s
        entities = [{"node": "node-0", "gpu": str(g), "job": "train"} for g in range(GPUS)]
        values = np.array([[99.0, c] for c in clocks])
        model.observe(
            Batch(
                "node-0",
                frames=[Frame(ts, ["gpu_utilization_percent", "gpu_sm_clock_mhz"], entities, values)],
            )
        )
        model.observe(Batch("sdk", training=step_records(ts, t)))
        model.advance(ts, [])
    throttled = model.summary("fleet", 0.0, 1e6)["groups"][0]["states"]["degraded"]
    assert math.isclose(throttled["causes"]["throttled"]["gpu_hours"] * HOUR, GPUS * 30, abs_tol=GPUS * 2)
    assert math.isclose(throttled["lost_gpu_hours"] / throttled["gpu_hours"], 0.3, abs_tol=0.01)


def test_a_gpu_computing_again_after_a_fatal_xid_was_reset_and_is_not_down() -> None:
    model = ProductivityModel()
    xid = Alert("al-1", "gpu_xid_fatal", "P1", "platform", {"node": "node-0", "gpu": "0"}, 5.0, "XID 94", 2.5)
    for t in range(1, 41):
        ts = float(t)
        model.observe(Batch("node-0", frames=[frame(ts, job=None, util=0.0 if ts <= 20 else 60.0, gpus=1)]))
        model.advance(ts, [xid])  # the alert is held on after the reset
    causes = seconds_by_cause(model)
    assert math.isclose(causes["fatal_xid"], 20.0, abs_tol=1.0), causes
    assert math.isclose(causes["unattributed"], 20.0, abs_tol=1.0), causes


def _clocked_run(
    model: ProductivityModel,
    clocks_at: Callable[[float], list[float]],
    until: int = 90,
) -> None:
    model.observe(started(0.0))
    entities = [{"node": "node-0", "gpu": str(g), "job": "train"} for g in range(GPUS)]
    for t in range(1, until + 1):
        ts = float(t)
        values = np.array([[99.0, c] for c in clocks_at(ts)])
        columns = ["gpu_utilization_percent", "gpu_sm_clock_mhz"]
        model.observe(Batch("node-0", frames=[Frame(ts, columns, entities, values)]))
        model.observe(Batch("sdk", training=step_records(ts, t, 1.2)))
        model.advance(ts, [])


def test_a_job_placed_on_slower_parts_is_productive_and_judged_by_its_slowest_part() -> None:
    # GPUs 2 and 3 are slower parts (1650 MHz) from the start: the job's normal pace. From 30 s GPU 0
    # drops to 1800 MHz, still faster than them: the job waits for them as before, nothing is lost.
    # From 60 s GPU 3 drops to 1320 MHz: now the job's steps slow by 1650 / 1320 = 1.25.
    def clocks(ts: float) -> list[float]:
        return [1980.0 if ts <= 30 else 1800.0, 1980.0, 1650.0, 1650.0 if ts <= 60 else 1320.0]

    model = ProductivityModel()
    _clocked_run(model, clocks)
    causes = seconds_by_cause(model)
    assert math.isclose(causes["throttled"], GPUS * 30, abs_tol=GPUS * 2), causes
    assert causes["training"] >= GPUS * 55, causes
    degraded = model.summary("fleet", 0.0, 1e6)["groups"][0]["states"]["degraded"]
    assert math.isclose(degraded["lost_gpu_hours"] / degraded["gpu_hours"], 0.2, abs_tol=0.01)


# -- a finished job's view is forgotten after the retention; its GPU time is still answered --


def ended(ts: float, kind: str = "job_ended") -> Batch:
    return Batch("sdk", events=[Event(ts, kind, {"job": "train"})])


def job_hours(model: ProductivityModel) -> float:
    rows = [g for g in model.summary("job", 0.0, 1e6)["groups"] if g["group"] == "train"]
    return float(rows[0]["gpu_hours"]) if rows else 0.0


def test_a_finished_job_is_forgotten_after_the_retention_and_its_gpu_time_stays() -> None:
    model = ProductivityModel(finished_job_retention_s=600.0)
    run_training(model, 100.0, steps_until=100.0)
    model.observe(ended(100.0))
    hours = job_hours(model)
    assert hours > 0 and model.job_status("train", 101.0) == "finished"
    # the GPUs go on reporting, without the job
    for t in range(101, 800):
        model.observe(Batch("node-0", frames=[frame(float(t), job=None)]))
        model.advance(float(t), [])
    assert "train" not in model.jobs
    assert model.counters.get("productivity_jobs_forgotten") == 1
    # the job's GPU time is the ledger's, not the view's: the same answer as before
    assert job_hours(model) == hours
    assert abs(hours * HOUR - GPUS * 100.0) < GPUS * 2


def test_a_finished_job_is_kept_within_the_retention_and_a_running_one_always() -> None:
    model = ProductivityModel(finished_job_retention_s=3600.0)
    run_training(model, 100.0, steps_until=100.0)
    model.observe(ended(100.0, "job_failed"))
    for t in range(101, 1000):
        model.observe(Batch("node-0", frames=[frame(float(t), job=None)]))
        model.advance(float(t), [])
    assert model.job_status("train", 1000.0) == "failed"
    assert model.counters.get("productivity_jobs_forgotten") == 0

    running = ProductivityModel(finished_job_retention_s=1.0)
    run_training(running, 400.0, steps_until=400.0)
    assert "train" in running.jobs


def test_a_job_a_gpu_still_names_is_not_forgotten() -> None:
    model = ProductivityModel(finished_job_retention_s=60.0)
    run_training(model, 50.0, steps_until=50.0)
    model.observe(ended(50.0))
    for t in range(51, 400):  # a stale label: the frames still name the job
        model.observe(Batch("node-0", frames=[frame(float(t))]))
        model.advance(float(t), [])
    assert "train" in model.jobs


def test_jobs_that_come_and_go_do_not_grow_the_models_entries() -> None:
    # a job a minute on each GPU for a week of minutes: each one its own slot (GPU, job, cause)
    model = ProductivityModel()
    for t in range(1, 10_081):
        model.observe(Batch("node-0", frames=[frame(60.0 * t, job=f"job-{t}")]))
        model.advance(60.0 * t, [])
    # what /metrics shows as gpuscope_hub_structure_entries{structure="productivity"}
    assert procmem.entries(model) < 4096 + 64
