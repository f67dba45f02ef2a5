"""Every fault kind: its signature, its knock-on effects, and recovery when it has a duration.

The cluster is :data:`sim.simtrace.SMALL`: ``train`` runs ranks 0-3 on node-0 and 4-7 on node-1
(rank 5 is node-1 GPU 1, 1 s steps, checkpoints every 120 s, a 200 s collective timeout); ``chat``
serves from node-2 GPUs 0-2. Faults start at 300 s, after a healthy baseline.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.quality.sketch import CategorySketch, NumericSketch, Sketch, sketch_from_json
from sim.simtrace import Trace, run, small

pytestmark = pytest.mark.long  # fifty faults, each simulated: a minute or more of CPU

AT = 300.0


def fault(line: str, duration: int = 600) -> Trace:
    return run(small(line, duration=duration))


def before(trace: Trace, series: str, node: str = "node-1", gpu: int = 1) -> np.ndarray:
    return trace.gpu(node, gpu, series, AT - 100, AT)


def during(
    trace: Trace, series: str, node: str = "node-1", gpu: int = 1, t0: float = AT + 60, t1: float = 1e18
) -> np.ndarray:
    return trace.gpu(node, gpu, series, t0, t1)


def assert_job_stalls_after(trace: Trace, t: float, job: str = "train", until: float = 150.0) -> None:
    assert trace.steps(job, t - 30, t), "the job was stepping before the fault"
    assert trace.steps(job, t + 1, t + until) == []


# -- hardware ---------------------------------------------------------------------------------------


def test_xid_79_gpu_falls_off_the_bus_and_the_job_stalls_then_fails() -> None:
    trace = fault("- {at: 300, kind: xid, target: {node: node-1, gpu: 1}, params: {code: 79}}")
    xid = trace.events("xid", node="node-1", gpu="1")
    lost = trace.events("gpu_lost", node="node-1", gpu="1")
    assert [(e.ts, e.data["code"]) for e in xid] == [(AT, 79)] and "fallen off the bus" in xid[0].data[
        "message"
    ]
    assert [e.ts for e in lost] == [AT]
    assert max(trace.gpu_times("node-1", 1)) < AT  # absent from every later frame of its node
    assert min(trace.gpu_times("node-1", 2)) < AT < max(trace.gpu_times("node-1", 2))
    assert trace.beats("train", 5, AT + 1) == []  # the rank on it died
    assert len(trace.beats("train", 4, AT + 1, AT + 100)) >= 99  # the others wait, alive
    assert_job_stalls_after(trace, AT)
    # survivors spin in NCCL: busy-looking but unproductive
    assert np.median(during(trace, "gpu_utilization_percent", gpu=2, t1=AT + 150)) >= 95
    assert np.median(during(trace, "gpu_sm_active_ratio", gpu=2, t1=AT + 150)) < 0.1
    assert np.median(during(trace, "gpu_power_watts", gpu=2, t1=AT + 150)) < 0.4 * 700
    failed = trace.events("job_failed", job="train")
    assert [e.ts for e in failed] == [AT + 200] and "watchdog" in failed[0].data["reason"]
    assert trace.beats("train", 4, AT + 201) == []


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_application_xid_is_only_an_event(code: int) -> None:
    trace = fault(f"- {{at: 300, kind: xid, target: {{node: node-1, gpu: 1}}, params: {{code: {code}}}}}")
    assert [e.data["code"] for e in trace.events("xid")] == [code]
    assert not trace.events("gpu_lost") and not trace.events("ecc_dbe") and not trace.events("job_failed")
    assert len(trace.steps("train", AT, AT + 200)) > 150
    assert max(trace.gpu_times("node-1", 1)) == 600


def test_xid_48_comes_with_a_double_bit_error() -> None:
    trace = fault("- {at: 300, kind: xid, target: {node: node-1, gpu: 1}, params: {code: 48}}")
    assert [e.data for e in trace.events("ecc_dbe")] == [{"count": 1}]
    assert (
        during(trace, "gpu_ecc_dbe_volatile_total")[0] == before(trace, "gpu_ecc_dbe_volatile_total")[-1] + 1
    )
    assert_job_stalls_after(trace, AT)


def test_xid_with_a_duration_resets_the_gpu_and_the_job_resumes_from_its_checkpoint() -> None:
    trace = fault("- {at: 300, kind: xid, target: {node: node-1, gpu: 1}, params: {code: 79}, duration: 100}")
    times = trace.gpu_times("node-1", 1)
    assert not [t for t in times if AT <= t < AT + 100] and AT + 100 in times
    restarted = trace.events("job_started", job="train")[1]
    assert restarted.ts == AT + 100 and restarted.data["restart"] == 1
    good = [e.data["step"] for e in trace.events("checkpoint_verified", job="train") if e.ts < AT]
    assert restarted.data["resumed_from_step"] == good[-1]
    assert trace.records("train", rank=5, t0=AT + 100)[0].step == good[-1] + 1
    assert len(trace.beats("train", 5, AT + 101, AT + 200)) >= 98


def test_ecc_dbe_counts_remaps_and_kills_the_rank() -> None:
    trace = fault("- {at: 300, kind: ecc_dbe, target: {node: node-1, gpu: 1}, duration: 120}")
    assert [e.data for e in trace.events("ecc_dbe", node="node-1", gpu="1")] == [{"count": 1}]
    assert [e.data["code"] for e in trace.events("xid", node="node-1", gpu="1")] == [48]
    for counter in (
        "gpu_ecc_dbe_volatile_total",
        "gpu_ecc_dbe_aggregate_total",
        "gpu_remapped_rows_uncorrectable",
    ):
        assert during(trace, counter, t0=AT, t1=AT + 120)[0] == before(trace, counter)[-1] + 1
    assert np.all(during(trace, "gpu_remapped_rows_pending", t0=AT, t1=AT + 120) == 1)
    assert np.all(during(trace, "gpu_utilization_percent", t0=AT, t1=AT + 120) == 0)
    assert np.all(during(trace, "gpu_memory_used_bytes", t0=AT, t1=AT + 120) == 0)
    assert trace.beats("train", 5, AT + 1, AT + 120) == []
    assert_job_stalls_after(trace, AT, until=120)
    # the reset at the end clears the volatile counter and the pending remap, not the lifetime ones
    assert during(trace, "gpu_ecc_dbe_volatile_total", t0=AT + 120)[0] == 0
    assert during(trace, "gpu_remapped_rows_pending", t0=AT + 120)[0] == 0
    assert (
        during(trace, "gpu_ecc_dbe_aggregate_total", t0=AT + 120)[0]
        == before(trace, "gpu_ecc_dbe_aggregate_total")[-1] + 1
    )


def test_gpu_lost_vanishes_and_its_rank_dies() -> None:
    trace = fault("- {at: 300, kind: gpu_lost, target: {node: node-1, gpu: 1}}")
    assert [e.ts for e in trace.events("gpu_lost", node="node-1", gpu="1")] == [AT]
    assert not trace.events("xid")
    assert max(trace.gpu_times("node-1", 1)) < AT
    assert trace.beats("train", 5, AT + 1) == []
    assert_job_stalls_after(trace, AT)


def test_gpu_failure_risk_creeps_up_then_ends_in_a_fatal_xid() -> None:
    trace = fault(
        "- {at: 300, kind: gpu_failure_risk, target: {node: node-1, gpu: 1}, params: {ramp: 1200}}",
        duration=1500,
    )
    sbe = trace.gpu("node-1", 1, "gpu_ecc_sbe_aggregate_total", AT, AT + 1199)
    early, late = np.diff(sbe[: len(sbe) // 3]).sum(), np.diff(sbe[-len(sbe) // 3 :]).sum()
    assert late > 3 * max(early, 1.0)  # corrected errors come faster as it wears
    rows = trace.gpu("node-1", 1, "gpu_remapped_rows_correctable", AT - 100, AT + 1199)
    assert rows[-1] - rows[0] >= 6 and np.all(np.diff(rows) >= 0)
    assert during(trace, "gpu_throttle_sw_thermal", t0=AT, t1=AT + 1199).max() == 1  # throttle episodes
    assert before(trace, "gpu_throttle_sw_thermal").max() == 0
    xid = trace.events("xid", node="node-1", gpu="1")
    assert [(e.data["code"]) for e in xid] == [79] and AT + 1199 <= xid[0].ts <= AT + 1201
    assert max(trace.gpu_times("node-1", 1)) <= xid[0].ts  # it fell off the bus
    assert trace.beats("train", 5, xid[0].ts + 1, AT + 1400) == []


def test_gpu_failure_risk_shapes_leave_out_the_symptoms_they_are_told_to() -> None:
    # worn memory: corrected errors, no remaps and no heat; the fatal XID still ends it
    trace = fault(
        "- {at: 300, kind: gpu_failure_risk, target: {node: node-1, gpu: 1},"
        " params: {ramp: 600, rows: 0, throttle: false, sbe_rate: 1.0}}",
        duration=1000,
    )
    sbe = trace.gpu("node-1", 1, "gpu_ecc_sbe_aggregate_total", AT, AT + 599)
    assert sbe[-1] - sbe[0] >= 100
    rows = trace.gpu("node-1", 1, "gpu_remapped_rows_correctable", AT - 100, AT + 599)
    assert rows[-1] == rows[0]
    assert during(trace, "gpu_throttle_sw_thermal", t0=AT, t1=AT + 599).max() == 0
    assert [e.data["code"] for e in trace.events("xid", node="node-1", gpu="1")] == [79]


def test_node_down_sends_nothing_and_its_ranks_and_replicas_go_silent() -> None:
    text = (
        small("- {at: 300, kind: node_down, target: {node: node-1}, duration: 120}")
        .replace("nodes: [node-2], gpus: [0, 1, 2]", "nodes: [node-2, node-1], gpus: [3]")
        .replace("[node-0, node-1], step_time", "[node-0, node-1], gpus: [0, 1, 2], step_time")
    )
    trace = run(text)
    times = trace.node_batch_times["node-1"]
    assert not [t for t in times if AT <= t < AT + 120] and AT + 120 in times
    for rank in (3, 4, 5):  # node-1 holds ranks 3-5 with three GPUs per node
        assert trace.beats("train", rank, AT + 1, AT + 120) == []
    assert len(trace.beats("train", 0, AT + 1, AT + 120)) >= 118
    assert_job_stalls_after(trace, AT, until=120)
    # the service keeps answering from node-2 alone
    nodes = {labels["node"] for labels in trace.service_labels(AT + 1, AT + 120)}
    assert nodes == {"node-2"}
    # the node reboots: kernel counters restart
    sent = trace.node("node-1", "node_tcp_out_segs_total")
    assert sent[np.argmax(np.diff(sent) < 0) + 1] < sent[0]


def test_thermal_throttle_heats_throttles_and_slows_the_whole_job() -> None:
    trace = fault("- {at: 300, kind: thermal_throttle, target: {node: node-1, gpu: 1}, duration: 200}")
    hot = during(trace, "gpu_temp_celsius", t0=AT + 90, t1=AT + 200)
    assert hot.min() >= 87 and hot.max() <= 93
    assert np.all(during(trace, "gpu_throttle_sw_thermal", t0=AT + 90, t1=AT + 200) == 1)
    assert np.all(
        np.bitwise_and(during(trace, "gpu_clock_event_reasons", t0=AT + 90, t1=AT + 200).astype(int), 0x20)
        == 0x20
    )
    assert during(trace, "gpu_sm_clock_mhz", t0=AT + 90, t1=AT + 200).max() < 0.9 * 1980
    assert before(trace, "gpu_throttle_sw_thermal").max() == 0
    base = np.median(trace.metric("train", "step_seconds", 0, AT - 100, AT))
    slow = np.median(trace.metric("train", "step_seconds", 0, AT + 90, AT + 200))
    assert slow > 1.15 * base
    skew = {
        r: np.median(trace.metric("train", "collective_arrival_skew_seconds", r, AT + 90, AT + 200))
        for r in range(8)
    }
    assert max(skew, key=lambda r: skew[r]) == 5
    # after the fault the GPU cools and the flags clear
    assert during(trace, "gpu_throttle_sw_thermal", t0=AT + 300).max() == 0
    assert during(trace, "gpu_temp_celsius", t0=AT + 280).max() < 75


def test_training_hang_keeps_heartbeats_but_no_step_and_gpus_spin() -> None:
    trace = fault("- {at: 300, kind: training_hang, target: {job: train}, duration: 150}")
    assert_job_stalls_after(trace, AT)
    for rank in range(8):
        assert len(trace.beats("train", rank, AT, AT + 150)) >= 149
    util = during(trace, "gpu_utilization_percent", t0=AT + 10, t1=AT + 150)
    assert np.median(util) >= 95
    assert during(trace, "gpu_sm_active_ratio", t0=AT + 10, t1=AT + 150).max() < 0.1
    assert np.median(during(trace, "gpu_power_watts", t0=AT + 10, t1=AT + 150)) < 0.4 * np.median(
        before(trace, "gpu_power_watts")
    )
    assert not trace.events("job_failed")
    assert len(trace.steps("train", AT + 150, AT + 250)) > 50  # it resumes


def test_rank_dropout_silences_the_rank_frees_its_gpu_and_stalls_the_job() -> None:
    trace = fault("- {at: 300, kind: rank_dropout, target: {job: train, rank: 5}}")
    assert trace.beats("train", 5, AT + 1) == []
    assert len(trace.beats("train", 6, AT + 1, AT + 150)) >= 148
    assert_job_stalls_after(trace, AT)
    assert np.all(during(trace, "gpu_utilization_percent", t0=AT + 1, t1=AT + 150) == 0)
    assert np.all(during(trace, "gpu_memory_used_bytes", t0=AT + 1, t1=AT + 150) == 0)
    assert {job for t, job in trace.gpu_jobs("node-1", 1) if AT < t < AT + 200} == {
        "train"
    }  # still allocated
    failed = trace.events("job_failed", job="train")
    assert [e.ts for e in failed] == [AT + 200] and "rank 5" in failed[0].data["reason"]
    assert {job for t, job in trace.gpu_jobs("node-1", 1) if t > AT + 200} == {None}


def test_straggler_arrives_late_and_sets_the_pace() -> None:
    trace = fault(
        "- {at: 300, kind: straggler, target: {job: train, rank: 5}, params: {slowdown: 1.5}, duration: 200}"
    )
    skew = trace.metric("train", "collective_arrival_skew_seconds", 5, AT + 5, AT + 200)
    others = trace.metric("train", "collective_arrival_skew_seconds", 2, AT + 5, AT + 200)
    assert np.median(skew) > 0.3 and np.median(others) < 0.05
    base = np.median(trace.metric("train", "step_seconds", 0, AT - 100, AT))
    assert np.median(trace.metric("train", "step_seconds", 0, AT + 5, AT + 200)) > 1.3 * base
    assert np.median(trace.metric("train", "step_seconds", 0, AT + 210, AT + 300)) < 1.1 * base
    # the waiting ranks' SMs idle part of the time
    assert np.median(during(trace, "gpu_sm_active_ratio", gpu=2, t0=AT + 5, t1=AT + 200)) < 0.85 * np.median(
        before(trace, "gpu_sm_active_ratio", gpu=2)
    )


def test_gpu_slow_lowers_clocks_without_a_throttle_reason() -> None:
    trace = fault("- {at: 300, kind: gpu_slow, target: {node: node-1, gpu: 1}, params: {slowdown: 1.25}}")
    clock = during(trace, "gpu_sm_clock_mhz", t0=AT + 1)
    peer = during(trace, "gpu_sm_clock_mhz", gpu=2, t0=AT + 1)
    assert np.median(clock) < 0.85 * np.median(peer)
    assert during(trace, "gpu_clock_event_reasons", t0=AT + 1, t1=AT + 100).max() in (0, 4)
    skew = trace.metric("train", "collective_arrival_skew_seconds", 5, AT + 5)
    assert np.median(skew) > 0.1


@pytest.mark.parametrize(
    ("mode", "flag"), [("cap", "gpu_throttle_sw_power"), ("brake", "gpu_throttle_hw_power_brake")]
)
def test_power_throttle_pins_power_and_slows_clocks(mode: str, flag: str) -> None:
    trace = fault(
        f"- {{at: 300, kind: power_throttle, target: {{node: node-1, gpu: 1}}, params: {{mode: {mode}}}}}"
    )
    flags = during(trace, flag, t0=AT + 1, t1=AT + 300)
    assert flags.mean() > 0.9  # set whenever the GPU computes (not during checkpoints)
    power = during(trace, "gpu_power_watts", t0=AT + 1, t1=AT + 300)
    assert np.median(power) < 0.6 * np.median(before(trace, "gpu_power_watts"))
    assert np.median(during(trace, "gpu_sm_clock_mhz", t0=AT + 1)) < 0.9 * 1980
    if mode == "cap":
        assert np.median(during(trace, "gpu_power_limit_watts", t0=AT + 1)) == pytest.approx(0.55 * 700)


@pytest.mark.parametrize(
    ("kind", "counter"),
    [
        ("ecc_sbe_storm", "gpu_ecc_sbe_volatile_total"),
        ("nvlink_errors", "gpu_nvlink_crc_errors_total"),
        ("pcie_replay", "gpu_pcie_replay_total"),
    ],
)
def test_error_counter_storms(kind: str, counter: str) -> None:
    trace = fault(f"- {{at: 300, kind: {kind}, target: {{node: node-1, gpu: 1}}, duration: 200}}")
    rate_before = np.diff(before(trace, counter)).sum() / 100
    values = during(trace, counter, t0=AT, t1=AT + 200)
    rate = (values[-1] - values[0]) / 200
    assert rate_before < 0.05 and rate > 2
    assert during(trace, counter, t0=AT + 200, t1=AT + 300)[-1] - during(trace, counter, t0=AT + 200)[0] < 2


def test_network_degraded_raises_retransmits_and_fabric_errors_and_slows_the_job() -> None:
    trace = fault("- {at: 300, kind: network_degraded, target: {node: node-1}, duration: 200}")
    sent = trace.node("node-1", "node_tcp_out_segs_total", AT + 1, AT + 200)
    retrans = trace.node("node-1", "node_tcp_retrans_segs_total", AT + 1, AT + 200)
    assert (retrans[-1] - retrans[0]) / (sent[-1] - sent[0]) > 0.02
    ib = trace.node("node-1", "node_ib_symbol_errors_total", AT + 1, AT + 200)
    assert ib[-1] - ib[0] > 500
    healthy = trace.node("node-0", "node_ib_symbol_errors_total")
    assert healthy[-1] - healthy[0] < 2
    base = np.median(trace.metric("train", "step_seconds", 0, AT - 100, AT))
    assert np.median(trace.metric("train", "step_seconds", 0, AT + 5, AT + 200)) > 1.15 * base


# -- jobs ---------------------------------------------------------------------------------------------


def test_idle_allocation_holds_gpus_that_do_nothing() -> None:
    trace = fault("- {at: 300, kind: idle_allocation, target: {job: train}, duration: 200}")
    assert np.all(during(trace, "gpu_utilization_percent", t0=AT + 1, t1=AT + 200) == 0)
    assert np.all(during(trace, "gpu_memory_used_bytes", t0=AT + 1, t1=AT + 200) > 30e9)
    assert np.all(during(trace, "gpu_power_watts", t0=AT + 1, t1=AT + 200) < 80)
    assert {job for t, job in trace.gpu_jobs("node-0", 0) if AT < t < AT + 200} == {"train"}
    assert len(trace.beats("train", 0, AT + 1, AT + 200)) >= 198
    assert_job_stalls_after(trace, AT)


def test_idle_allocation_of_a_service_stops_its_traffic() -> None:
    trace = fault("- {at: 300, kind: idle_allocation, target: {job: chat}, duration: 200}")
    assert trace.service("inference_requests_per_second", AT + 5, AT + 200).max() == 0
    assert np.all(trace.gpu("node-2", 0, "gpu_utilization_percent", AT + 1, AT + 200) == 0)


def test_job_crash_fails_frees_gpus_and_restarts_after_its_duration() -> None:
    trace = fault(
        "- {at: 300, kind: job_crash, target: {job: train}, params: {exit_code: 137}, duration: 100}"
    )
    failed = trace.events("job_failed", job="train")
    assert [(e.ts, e.data["exit_code"]) for e in failed] == [(AT, 137)] and failed[0].data["reason"]
    assert trace.beats("train", 0, AT + 1, AT + 100) == []
    assert {job for t, job in trace.gpu_jobs("node-0", 0) if AT <= t < AT + 100} == {None}
    assert [e.ts for e in trace.events("job_started", job="train")] == [0.0, AT + 100]
    assert len(trace.steps("train", AT + 100, AT + 200)) > 50


def test_job_crash_of_a_service_stops_its_frames() -> None:
    trace = fault("- {at: 300, kind: job_crash, target: {job: chat}}")
    assert [e.ts for e in trace.events("job_failed", job="chat")] == [AT]
    assert trace.service_labels(AT + 1) == []


def test_step_time_regression() -> None:
    trace = fault("- {at: 300, kind: step_time_regression, target: {job: train}, params: {factor: 1.4}}")
    base = np.median(trace.metric("train", "step_seconds", 3, AT - 100, AT))
    now = np.median(trace.metric("train", "step_seconds", 3, AT + 5))
    assert now == pytest.approx(1.4 * base, rel=0.05)
    tokens = np.median(trace.metric("train", "tokens_per_second", 3, AT + 5))
    assert tokens < 0.75 * np.median(trace.metric("train", "tokens_per_second", 3, AT - 100, AT))


def test_loss_nan() -> None:
    trace = fault("- {at: 300, kind: loss_nan, target: {job: train}, duration: 100}")
    assert np.all(np.isfinite(trace.metric("train", "loss", None, 0, AT)))
    assert np.all(np.isnan(trace.metric("train", "loss", None, AT + 1, AT + 100)))
    assert np.all(np.isnan(trace.metric("train", "grad_norm", None, AT + 1, AT + 100)))
    assert np.all(np.isfinite(trace.metric("train", "loss", None, AT + 101)))


def test_loss_spike_jumps_then_decays() -> None:
    trace = fault("- {at: 300, kind: loss_spike, target: {job: train}, params: {factor: 3}}")
    base = np.median(trace.metric("train", "loss", 0, AT - 30, AT))
    spike = trace.metric("train", "loss", 0, AT, AT + 5)
    assert spike.max() > 2.5 * base
    assert np.median(trace.metric("train", "loss", 0, AT + 200)) < 1.1 * base


def test_loss_divergence_trends_up() -> None:
    trace = fault("- {at: 300, kind: loss_divergence, target: {job: train}}")
    loss = trace.metric("train", "loss", 0, AT)
    assert np.median(loss[-30:]) > 1.15 * np.median(loss[:30])


def test_loss_plateau_stops_improving() -> None:
    healthy = run(small(duration=600))
    trace = fault("- {at: 300, kind: loss_plateau, target: {job: train}}")
    flat = trace.metric("train", "loss", 0, AT)
    falling = healthy.metric("train", "loss", 0, AT)
    assert abs(np.median(flat[-50:]) / np.median(flat[:50]) - 1) < 0.01
    assert np.median(falling[-50:]) < 0.95 * np.median(falling[:50])


def test_grad_explosion_and_gradient_skew() -> None:
    trace = fault(
        "- {at: 300, kind: grad_explosion, target: {job: train}, params: {factor: 30}, duration: 60}"
    )
    base = np.median(trace.metric("train", "grad_norm", None, AT - 60, AT))
    assert np.median(trace.metric("train", "grad_norm", None, AT + 1, AT + 60)) > 20 * base
    skewed = fault("- {at: 300, kind: gradient_skew, target: {job: train, rank: 6}, params: {factor: 5}}")
    six = np.median(skewed.metric("train", "grad_norm", 6, AT + 1))
    one = np.median(skewed.metric("train", "grad_norm", 1, AT + 1))
    assert six > 4 * one


def test_checkpoint_failure_on_the_last_rank() -> None:
    trace = fault("- {at: 300, kind: checkpoint_failure, target: {job: train}}")
    failed = trace.events("checkpoint_failed", job="train")
    assert failed and {e.labels["rank"] for e in failed} == {"7"}
    assert all(e.data["reason"].startswith("OSError") and e.ts > AT for e in failed)
    completed_after = {
        e.labels["rank"] for e in trace.events("checkpoint_completed", job="train") if e.ts > AT
    }
    assert completed_after == {str(r) for r in range(7)}
    assert not [e for e in trace.events("checkpoint_verified", job="train") if e.ts > AT]
    assert len(trace.steps("train", AT, 600)) > 200  # training goes on


def test_checkpoint_corrupt_fails_verification() -> None:
    trace = fault("- {at: 300, kind: checkpoint_corrupt, target: {job: train}}")
    verified = trace.events("checkpoint_verified", job="train")
    assert [e.data["ok"] for e in verified if e.ts < AT] == [True, True]
    after = [e.data for e in verified if e.ts > AT]
    assert after and all(d["ok"] is False and isinstance(d["step"], int) for d in after)


def test_checkpoint_stop() -> None:
    trace = fault("- {at: 300, kind: checkpoint_stop, target: {job: train}}", duration=900)
    assert [e for e in trace.events("checkpoint_started", job="train", rank="0") if e.ts > AT] == []
    assert len(trace.steps("train", AT, 900)) > 500


def test_memory_fragmentation_grows_and_the_allocator_retries() -> None:
    trace = fault("- {at: 300, kind: memory_fragmentation, target: {job: train, rank: 2}}", duration=900)
    frag = trace.metric("train", "memory_fragmentation_ratio", 2)
    healthy = trace.metric("train", "memory_fragmentation_ratio", 3)
    assert frag[-1] > 2 * frag[0] and abs(healthy[-1] - healthy[0]) < 0.01
    retries = trace.metric("train", "alloc_retries_total", 2)
    assert retries[-1] > 10 and trace.metric("train", "alloc_retries_total", 3)[-1] == 0
    reserved = trace.metric("train", "memory_reserved_bytes", 2)
    assert reserved[-1] > reserved[0]
    assert (
        trace.gpu("node-0", 2, "gpu_memory_used_bytes", 800, 899).min()
        > trace.gpu("node-0", 2, "gpu_memory_used_bytes", 0, AT).max()
    )


# -- services -----------------------------------------------------------------------------------------


def svc_ratio(trace: Trace, metric: str) -> float:
    return float(
        np.median(trace.service(metric, AT + 5, AT + 200)) / np.median(trace.service(metric, 100, AT))
    )


@pytest.mark.parametrize(
    ("line", "metric", "low"),
    [
        ("latency_spike, target: {service: chat}, params: {factor: 3}", "inference_latency_p95_seconds", 2.5),
        ("ttft_regression, target: {service: chat}, params: {factor: 3}", "inference_ttft_p95_seconds", 2.5),
        ("kv_cache_pressure, target: {service: chat}", "inference_kv_cache_usage_ratio", 2.0),
    ],
)
def test_service_fault_moves_its_metric(line: str, metric: str, low: float) -> None:
    trace = fault(f"- {{at: 300, kind: {line}, duration: 200}}")
    assert svc_ratio(trace, metric) > low
    after = np.median(trace.service(metric, 560, 600))
    assert after < 1.5 * np.median(trace.service(metric, 100, AT)) + 1


def test_error_burst() -> None:
    trace = fault(
        "- {at: 300, kind: error_burst, target: {service: chat}, params: {error_rate: 0.2}, duration: 200}"
    )
    errors = trace.service("inference_errors_per_second", AT + 1, AT + 200).sum()
    served = trace.service("inference_requests_per_second", AT + 1, AT + 200).sum()
    assert errors / served == pytest.approx(0.2, abs=0.03)
    assert (
        trace.service("inference_errors_per_second", 0, AT).sum()
        / trace.service("inference_requests_per_second", 0, AT).sum()
        < 0.01
    )


def test_queue_buildup_then_rejections_raise_latency() -> None:
    trace = fault("- {at: 300, kind: queue_buildup, target: {service: chat}, duration: 250}")
    queue = trace.service("inference_queue_depth", AT, AT + 250)
    assert queue[-1] > queue[10] > queue[0]
    assert svc_ratio(trace, "inference_latency_p95_seconds") > 3


def test_kv_cache_pressure_preempts() -> None:
    trace = fault("- {at: 300, kind: kv_cache_pressure, target: {service: chat}, duration: 200}")
    preempted = trace.service("inference_preemptions_total")
    assert preempted[int(AT) - 10] == 0 and preempted[-1] > 10
    assert trace.service("inference_kv_cache_usage_ratio", AT + 1, AT + 200).min() > 0.95


def test_bad_version_promotes_regresses_and_rolls_back() -> None:
    trace = fault("- {at: 300, kind: bad_version, target: {service: chat}, duration: 200}")
    promoted = trace.events("model_version_promoted", service="chat")
    assert [(e.ts, e.data["version"]) for e in promoted] == [(AT, "v4"), (AT + 200, "v3")]
    assert {lab["version"] for lab in trace.service_labels(AT + 1, AT + 200)} == {"v4"}
    assert {lab["version"] for lab in trace.service_labels(AT + 201)} == {"v3"}
    assert svc_ratio(trace, "inference_latency_p95_seconds") > 1.4


def quality(trace: Trace, signal: str, feature: str, t0: float, t1: float) -> Sketch:
    """The sketches of one signal and feature sent in ``[t0, t1)``, merged."""
    sketches = [
        sketch_from_json(e.data["sketch"])
        for e in trace.events("quality_sketch", service="chat", signal=signal, feature=feature)
        if t0 <= e.ts < t1
    ]
    assert sketches, (signal, feature, t0, t1)
    merged = sketches[0]
    for sk in sketches[1:]:
        merged.merge(sk)  # type: ignore[arg-type]
    return merged


def business(trace: Trace, t0: float, t1: float) -> float:
    values = [
        float(f.values[0, 0])
        for b in trace.batches
        if b.source == "sdk:chat"
        for f in b.frames
        if t0 <= f.ts < t1 and f.metrics == ["model_business_metric"]
    ]
    assert values
    return float(np.mean(values))


def test_prediction_drift_moves_predictions_to_one_class() -> None:
    trace = fault("- {at: 300, kind: prediction_drift, target: {service: chat}, params: {shift: 0.4}}")
    before_, after = (
        quality(trace, "prediction", "prediction", 0, AT),
        quality(trace, "prediction", "prediction", AT + 30, 900),
    )
    assert isinstance(before_, CategorySketch) and isinstance(after, CategorySketch)
    share = [sk.counts["escalate"] / sk.count for sk in (before_, after)]
    assert share[0] < 0.12 and share[1] == pytest.approx(0.08 * 0.6 + 0.4, abs=0.05)


def test_confidence_shift_lowers_confidence() -> None:
    trace = fault("- {at: 300, kind: confidence_shift, target: {service: chat}, params: {shift: -1.0}}")
    before_, after = (
        quality(trace, "confidence", "confidence", 0, AT),
        quality(trace, "confidence", "confidence", AT + 30, 900),
    )
    assert isinstance(before_, NumericSketch) and isinstance(after, NumericSketch)
    assert 0.8 < before_.mean < 0.9 and after.mean < before_.mean - 0.08


def test_input_drift_lengthens_prompts_and_leaves_languages() -> None:
    trace = fault("- {at: 300, kind: input_drift, target: {service: chat}, params: {factor: 2}}")
    before_, after = (
        quality(trace, "input", "prompt_tokens", 0, AT),
        quality(trace, "input", "prompt_tokens", AT + 30, 900),
    )
    assert isinstance(before_, NumericSketch) and isinstance(after, NumericSketch)
    assert after.quantile(0.5) / before_.quantile(0.5) == pytest.approx(2.0, rel=0.1)
    lang = [quality(trace, "input", "language", t0, t1) for t0, t1 in ((0, AT), (AT + 30, 900))]
    assert all(isinstance(sk, CategorySketch) and 0.55 < sk.counts["en"] / sk.count < 0.65 for sk in lang)


def test_business_drop_lowers_the_business_metric_until_it_ends() -> None:
    trace = fault("- {at: 300, kind: business_drop, target: {service: chat}, duration: 300}", duration=900)
    base, low, back = (
        business(trace, 0, AT),
        business(trace, AT + 60, AT + 300),
        business(trace, AT + 360, 900),
    )
    assert low / base == pytest.approx(0.7, abs=0.05) and back / base == pytest.approx(1.0, abs=0.05)


def test_faults_work_on_any_cluster_shape() -> None:
    text = (
        "seed: 9\nduration: 400\ninterval: 2\n"
        "cluster: {nodes: 5, gpus_per_node: 2, gpu_model: A100-SXM4-80GB}\n"
        "jobs:\n  - {name: j, kind: training, nodes: [node-4, node-1, node-3], gpus: [1], step_time: 7.5,"
        " checkpoint_every: 0}\n"
        "faults:\n  - {at: 101, kind: xid, target: {node: node-3, gpu: 1}}\n"
        "  - {at: 50, kind: thermal_throttle, target: {node: node-1, gpu: 1}, duration: 80}\n"
    )
    trace = run(text)
    assert trace.ticks == 200 and trace.beats("j", 2, 102) == [] and len(trace.beats("j", 1, 102, 300)) >= 197
    assert [e.ts for e in trace.events("xid")] == [101.0]
    assert trace.gpu("node-1", 1, "gpu_temp_celsius", 110, 130).min() >= 85  # the A100's slowdown point
    assert trace.gpu("node-1", 1, "gpu_throttle_sw_thermal", 110, 130).min() == 1
    assert trace.steps("j", 102) == []
