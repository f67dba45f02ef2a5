"""job_failed from ranks' last words: one alert naming the first rank to fail by its own cause;
loss_nan naming the first NaN step."""

from __future__ import annotations

import math

from gpuscope.detect.lifecycle import LifecycleDetector
from gpuscope.detect.loss import LossDetector
from gpuscope.detect.ranks import RankDetector
from gpuscope.detect.training import TrainingLivenessDetector
from gpuscope.model import Event, Finding, TrainingRecord


def _labels(rank: int) -> dict[str, str]:
    return {"job": "j", "rank": str(rank), "node": f"n{rank // 2}", "gpu": str(rank % 2)}


def _beat(rank: int, ts: float) -> Event:
    return Event(ts, "heartbeat", _labels(rank), {"step": int(ts)})


def _words(rank: int, ts: float, cause: str, reason: str) -> Event:
    return Event(ts, "job_failed", _labels(rank), {"cause": cause, "reason": reason})


def _started() -> Event:
    return Event(0.0, "job_started", {"job": "j"}, {"kind": "training", "world_size": 3})


def _failed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.rule == "job_failed"]


def test_first_to_fail_is_named_when_its_words_arrive_last() -> None:
    det = LifecycleDetector(settle=2.5)
    det.on_event(_started())
    for ts in range(10):
        for rank in range(3):
            det.on_event(_beat(rank, float(ts)))
    det.on_event(_words(0, 10.4, "signal", "terminated by SIGTERM"))
    assert _failed(det.evaluate(100.0)) == []  # the others' words may still be on their way
    det.on_event(_words(2, 10.2, "exception", "RuntimeError: Connection closed by peer"))
    det.on_event(_words(1, 10.0, "exception", "ValueError: bad batch"))
    assert _failed(det.evaluate(102.0)) == []
    [finding] = _failed(det.evaluate(102.6))
    assert finding.entity == {"job": "j"}
    assert finding.details["first_rank"] == 1 and finding.details["reason"] == "ValueError: bad batch"
    assert [d["rank"] for d in finding.details["death_order"]] == [1, 2, 0]
    assert finding.summary.startswith("Job j failed: rank 1 (n0 GPU 1) failed first: ValueError: bad batch")
    assert finding.details["links"] == [{"node": "n0", "gpu": "1"}]
    assert len(_failed(det.evaluate(200.0))) == 1  # holds
    det.on_event(_started())  # the job restarts: the failure is over
    assert _failed(det.evaluate(201.0)) == []


def test_a_rank_that_died_silently_before_the_others_spoke_is_the_root() -> None:
    det = LifecycleDetector(settle=2.5)
    det.on_event(_started())
    for ts in range(10):
        for rank in range(3):
            if rank != 2 or ts <= 8:
                det.on_event(_beat(rank, float(ts)))
    det.on_event(_words(0, 9.6, "exception", "RuntimeError: Connection closed by peer"))
    det.on_event(_words(1, 9.7, "signal", "terminated by SIGTERM"))
    det.evaluate(50.0)
    [finding] = _failed(det.evaluate(53.0))
    assert finding.details["first_rank"] == 2 and finding.details["cause"] == "silent"
    assert [d["rank"] for d in finding.details["death_order"]] == [2, 0, 1]
    assert "rank 2 (n1 GPU 0) stopped without last words 1.6 s before the first report" in finding.summary


def test_only_signals_name_the_earliest_and_a_job_level_failure_is_immediate() -> None:
    det = LifecycleDetector(settle=2.5)
    det.on_event(_started())
    for rank, ts in ((2, 5.02), (0, 5.0), (1, 5.01)):
        det.on_event(_words(rank, ts, "signal", "terminated by SIGTERM"))
    det.evaluate(10.0)
    [finding] = _failed(det.evaluate(13.0))
    assert finding.details["first_rank"] == 0 and finding.details["reason"] == "terminated by SIGTERM"

    other = LifecycleDetector()
    other.on_event(Event(5.0, "job_failed", {"job": "k"}, {"reason": "OOM", "exit_code": 137}))
    [finding] = _failed(other.evaluate(5.0))
    assert finding.summary == "Job k failed: OOM"


def test_no_rank_is_lost_after_one_rank_reported_the_failure() -> None:
    det = TrainingLivenessDetector()
    det.on_event(_started())
    for ts in range(10):
        for rank in range(3):
            det.on_event(_beat(rank, float(ts)))
        det.evaluate(float(ts))
    det.on_event(_words(1, 10.0, "exception", "ValueError: bad batch"))
    det.on_event(_words(0, 10.5, "signal", "terminated by SIGTERM"))  # a second word changes nothing
    assert [f.rule for t in range(10, 60) for f in det.evaluate(float(t))] == []


def test_loss_nan_names_the_first_nan_step_of_the_episode() -> None:
    det = LossDetector()
    for step in range(30):
        loss = math.nan if step >= 21 else 1.0 / (step + 1)
        for rank in range(3):
            det.on_training(TrainingRecord(float(step), "j", rank, step, {"loss": loss}))
        det.evaluate(float(step))
    [finding] = [f for f in det.evaluate(30.0) if f.rule == "loss_nan"]
    assert finding.details["step"] == 21 and finding.details["last_step"] == 29
    assert finding.summary == "Loss of job j is NaN/Inf from step 21 (still at step 29)"


def test_straggler_summary_says_the_lag_injected_mid_run() -> None:
    det = RankDetector()
    found: list[Finding] = []
    for step in range(120):
        late = 0.112 if step >= 60 else 0.0
        for rank in range(3):
            gap = 0.2 + (late if rank == 1 else 0.0) + 0.001 * rank
            metrics = {"step_seconds": 0.4, "collective_arrival_gap_seconds": gap}
            det.on_training(TrainingRecord(float(step), "j", rank, step, metrics))
        found = [f for f in det.evaluate(float(step)) if f.rule == "training_straggler"]
        if found:
            break
    [finding] = found
    assert finding.entity["rank"] == "1"
    assert abs(finding.details["lag_seconds"] - 0.112) < 0.005, finding.details
    assert "(0.111 s of 0.400 s)" in finding.summary or "(0.112 s of 0.400 s)" in finding.summary


def test_a_cpu_ranks_loss_names_its_node_and_no_gpu() -> None:
    """Seen: a CPU-only rank lost as "rank 2 on node-1 GPU 0"; its labels carry no gpu."""
    det = TrainingLivenessDetector()
    started = {"world_size": 3, "placement": [[0, "node-1", None]]}
    det.on_event(Event(0.0, "job_started", {"job": "c"}, started))
    lost: list[Finding] = []
    for ts in range(60):
        for rank in range(3):
            if rank != 2 or ts < 20:
                labels = {"job": "c", "rank": str(rank), "node": "node-1"}
                det.on_event(Event(float(ts), "heartbeat", labels, {"step": ts}))
        lost += [f for f in det.evaluate(float(ts)) if f.rule == "rank_lost"]
    assert lost, "rank 2 went silent"
    assert all(f.entity == {"job": "c", "rank": "2", "node": "node-1"} for f in lost)
    assert all("on node-1 CPU stopped heartbeating" in f.summary for f in lost), lost[0].summary


def _exit(rank: int, ts: float, **data: object) -> Event:
    labels = {"job": "j", "rank": str(rank), "node": f"n{rank // 2}"}  # the agent knows no GPU
    return Event(ts, "process_exited", labels, {"pid": 4000 + rank, **data})


def test_the_agents_exit_names_a_sigkilled_rank_first_with_its_signal() -> None:
    """Seen: a SIGKILLed rank (no last words) named after survivors, or never; its agent saw it die."""
    det = LifecycleDetector(settle=2.5)
    det.on_event(_started())
    for ts in range(10):
        for rank in range(3):
            det.on_event(_beat(rank, float(ts)))  # rank 2 beat at 9.0 like the others: silence says nothing
    det.on_event(_words(0, 10.3, "signal", "terminated by SIGTERM"))
    det.on_event(_words(1, 10.4, "signal", "terminated by SIGTERM"))
    det.on_event(_exit(0, 10.35, signal="SIGTERM"))  # words win over the agent's view of the same death
    det.on_event(_exit(2, 10.1, signal="SIGKILL"))
    det.evaluate(50.0)
    [finding] = _failed(det.evaluate(53.0))
    details = finding.details
    assert details["first_rank"] == 2 and details["cause"] == "killed" and details["signal"] == "SIGKILL"
    assert details["exit_code"] is None and details["failed_at"] == 10.1
    assert [(d["rank"], d["cause"]) for d in details["death_order"]] == [
        (2, "killed"),
        (0, "signal"),
        (1, "signal"),
    ]
    assert finding.summary.startswith(
        "Job j failed: rank 2 (n1 GPU 0) died first: killed by SIGKILL (pid 4002, seen by the node's agent)"
    ), finding.summary
    assert details["links"] == [{"node": "n1", "gpu": "0"}]  # the GPU from the rank's own heartbeats


def test_an_exit_code_names_the_rank_and_a_clean_exit_does_not() -> None:
    det = LifecycleDetector(settle=0.0)
    det.on_event(_started())
    for rank in range(3):
        det.on_event(_beat(rank, 1.0))
    det.on_event(_exit(0, 1.5, exit_code=0))  # finished its part cleanly: neither a death nor silent
    det.on_event(_exit(1, 2.0, exit_code=3))
    det.on_event(_words(2, 2.5, "signal", "terminated by SIGTERM"))
    [finding] = _failed(det.evaluate(10.0))
    assert finding.details["first_rank"] == 1 and finding.details["exit_code"] == 3
    assert [d["rank"] for d in finding.details["death_order"]] == [1, 2]
    assert "rank 1 (n0 GPU 1) died first: exited with code 3" in finding.summary


def test_a_fallback_exit_without_status_yields_to_the_silence_it_bounds() -> None:
    det = LifecycleDetector(settle=0.0)
    det.on_event(_started())
    for ts in range(10):
        for rank in range(3):
            if rank != 2 or ts <= 8:
                det.on_event(_beat(rank, float(ts)))
    det.on_event(_exit(2, 10.0))  # /proc polling noticed it gone a round later than it died
    det.on_event(_words(0, 9.6, "exception", "RuntimeError: Connection closed by peer"))
    [finding] = _failed(det.evaluate(20.0))
    assert finding.details["first_rank"] == 2 and finding.details["cause"] == "silent"
    assert finding.details["failed_at"] == 8.0


def test_an_exit_of_a_rank_never_heard_names_its_node_only() -> None:
    det = LifecycleDetector(settle=0.0)
    det.on_event(_started())
    det.on_event(_exit(2, 1.0, signal="SIGKILL"))  # the hub restarted: no heartbeat says its GPU
    det.on_event(_words(0, 1.2, "signal", "terminated by SIGTERM"))
    [finding] = _failed(det.evaluate(10.0))
    assert finding.summary.startswith("Job j failed: rank 2 (n1) died first: killed by SIGKILL"), (
        finding.summary
    )
