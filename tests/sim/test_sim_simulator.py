"""The healthy life of the simulated cluster, determinism, placement, job lifetimes, the wire format."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuscope.ingest.payload import decode_json, encode_batch, parse_batch
from gpuscope.signals import GPU_METRICS, NODE_METRICS, SERVICE_METRICS
from gpuscope.sim import Simulator, builtin_scenario, load_scenario
from sim.simtrace import Trace, run, small

THROTTLE_FLAGS = [m for m in GPU_METRICS if m.startswith("gpu_throttle_")]


@pytest.fixture(scope="module")
def healthy() -> Trace:
    """The built-in three healthy hours (about 5 s to simulate)."""
    return run(load_scenario(builtin_scenario("healthy-3h")))


def test_healthy_has_no_hardware_events_or_failures(healthy: Trace) -> None:
    kinds = {e.kind for e in healthy.all_events}
    assert kinds == {
        "heartbeat",
        "job_started",
        "job_ended",
        "checkpoint_started",
        "checkpoint_completed",
        "checkpoint_verified",
        "quality_sketch",  # what the inference SDK sends about model outputs and inputs
    }
    assert all(e.data["ok"] for e in healthy.events("checkpoint_verified"))
    assert len(healthy.events("job_started")) == len(healthy.events("job_ended")) == 6


def test_healthy_throttle_flags_are_only_brief_blips(healthy: Trace) -> None:
    blips = 0
    for node, gpu in healthy.gpu_rows:
        flags = np.max([healthy.gpu(node, gpu, f) for f in THROTTLE_FLAGS], axis=0) > 0
        padded = np.concatenate([[False], flags, [False]])
        edges = np.flatnonzero(np.diff(padded.astype(int)))
        runs = edges[1::2] - edges[::2]
        assert runs.size == 0 or runs.max() <= 3, (node, gpu)
        blips += runs.size
    assert blips > 0  # the software power cap does engage now and then under load


def test_healthy_telemetry_sits_at_real_levels(healthy: Trace) -> None:
    busy = healthy.gpu("node-0", 0, "gpu_utilization_percent", 600, 900)
    sm = healthy.gpu("node-0", 0, "gpu_sm_active_ratio", 600, 900)
    power = healthy.gpu("node-0", 0, "gpu_power_watts", 600, 900)
    temp = healthy.gpu("node-0", 0, "gpu_temp_celsius", 600, 900)
    clock = healthy.gpu("node-0", 0, "gpu_sm_clock_mhz", 600, 900)
    assert np.median(busy) >= 97 and 0.5 < np.median(sm) < 0.9
    assert 0.8 * 700 < np.median(power) < 700 and power.max() < 700
    assert 50 <= np.median(temp) <= 70
    assert np.median(clock) == 1980 and clock.min() >= 1900
    # a GPU no job ever uses: idle power, cool, idle clock, nothing allocated
    idle_power = healthy.gpu("node-2", 0, "gpu_power_watts", 4230, 4300)
    assert np.all(idle_power < 80) and np.all(healthy.gpu("node-2", 0, "gpu_sm_clock_mhz", 4230, 4300) == 345)
    assert np.all(healthy.gpu("node-2", 0, "gpu_memory_used_bytes", 4230, 4300) == 0)
    # every counter only moves forward, at low base rates
    for metric in ("gpu_ecc_sbe_volatile_total", "gpu_pcie_replay_total", "gpu_nvlink_crc_errors_total"):
        values = healthy.gpu("node-1", 4, metric)
        assert np.all(np.diff(values) >= 0) and values[-1] - values[0] <= 3
    retrans = healthy.node("node-0", "node_tcp_retrans_segs_total")
    sent = healthy.node("node-0", "node_tcp_out_segs_total")
    assert (retrans[-1] - retrans[0]) / (sent[-1] - sent[0]) < 1e-3


def test_healthy_steps_advance_except_in_checkpoints(healthy: Trace) -> None:
    for spec in healthy.scenario.jobs:
        if spec.kind != "training":
            continue
        recs = healthy.records(spec.name, rank=0)
        ts = np.array([r.ts for r in recs])
        assert [r.step for r in recs] == list(range(1, len(recs) + 1))
        pauses = [(a, b) for a, b in itertools.pairwise(ts) if b - a > 3 * spec.step_time]
        saves = [
            (e.ts, f.ts)
            for e, f in zip(
                healthy.events("checkpoint_started", job=spec.name, rank="0"),
                healthy.events("checkpoint_completed", job=spec.name, rank="0"),
                strict=True,
            )
        ]
        assert len(pauses) == len(saves)
        for (a, b), (s, e) in zip(pauses, saves, strict=True):
            assert a == s and b - e < 3 * spec.step_time and 10 <= e - s <= 60
        step = np.array([r.metrics["step_seconds"] for r in recs])
        assert (
            abs(np.median(step) / spec.step_time - 1) < 0.05
            and np.percentile(step, 99) < 1.3 * spec.step_time
        )


def test_healthy_loss_warms_up_and_decays_with_a_schedule_change(healthy: Trace) -> None:
    loss = healthy.metric("pretrain-7b", "loss", rank=0)
    lr = healthy.metric("pretrain-7b", "learning_rate", rank=0)
    assert loss[:20].mean() > 8 and loss[-100:].mean() < 0.4 * loss[:20].mean()
    assert np.all(np.isfinite(loss)) and lr[0] < lr[200] / 10  # linear warm-up
    ratios = lr[1:] / lr[:-1]
    assert np.count_nonzero(ratios < 0.5) == 1  # one step-down, the rest is a smooth cosine
    grads = healthy.metric("pretrain-7b", "grad_norm", rank=0)
    assert grads[:20].mean() > 3 * grads[-200:].mean()


def test_heartbeats_every_second_per_rank(healthy: Trace) -> None:
    beats = np.array(healthy.beats("pretrain-7b", 11))
    assert len(beats) >= 10790 and np.allclose(np.diff(beats), 1.0)
    assert healthy.events("heartbeat", job="pretrain-7b", rank="11")[0].labels == {
        "job": "pretrain-7b",
        "rank": "11",
        "node": "node-1",
        "gpu": "3",
    }


def test_jobs_allocate_gpus_only_while_they_run(healthy: Trace) -> None:
    owners = healthy.gpu_jobs("node-2", 5)
    assert {job for t, job in owners if t < 300} == {None}
    assert {job for t, job in owners if 300 <= t < 4200} == {"finetune-a"}
    assert {job for t, job in owners if 4200 <= t < 4320} == {None}  # the idle gap between the fine-tunes
    ended = healthy.events("job_ended", job="finetune-b")[0].ts
    assert {job for t, job in owners if 4320 <= t < ended} == {"finetune-b"}
    assert {job for t, job in owners if t > ended + 1} == {None}
    assert healthy.steps("finetune-b")[-1] == 5000  # it ended on its step budget
    started = {e.labels["job"]: e.ts for e in healthy.events("job_started")}
    assert started["finetune-a"] == 300 and started["eval-sweep-2"] == 6000
    assert healthy.events("job_ended", job="finetune-a")[0].ts == 4200


def test_inference_load_follows_the_day(healthy: Trace) -> None:
    rps = healthy.service("inference_requests_per_second")
    morning, noon = rps[:1800].mean(), rps[-1800:].mean()
    assert noon > 1.2 * morning  # 06:00 -> 09:00, the peak is at 14:00
    per_second = np.diff(rps[:600])
    assert per_second.std() > 1  # Poisson noise second to second
    errors = healthy.service("inference_errors_per_second")
    assert 0 < errors.sum() / rps.sum() < 0.005
    kv = healthy.service("inference_kv_cache_usage_ratio")
    p95 = healthy.service("inference_latency_p95_seconds")
    assert kv.max() < 0.8 and np.median(p95) < 3
    assert healthy.service_labels()[0] == {
        "service": "chat-api",
        "model": "chat",
        "version": "v7",
        "node": "node-3",
    }


def test_placement_is_reported_at_job_start() -> None:
    trace = run(small(duration=30))
    started = trace.events("job_started", job="train")[0]
    assert started.data == {
        "kind": "training",
        "world_size": 8,
        "placement": [[r, f"node-{r // 4}", r % 4] for r in range(8)],
        "checkpoint_every": 120.0,  # the scenario's interval, as a script passes it to the SDK
    }
    chat = trace.events("job_started", job="chat")[0].data
    assert chat["kind"] == "inference" and chat["placement"] == [
        [0, "node-2", 0],
        [1, "node-2", 1],
        [2, "node-2", 2],
    ]
    assert (chat["service"], chat["model"], chat["version"]) == ("chat", "chat", "v3")
    rec = trace.records("train", rank=6)[0]
    assert rec.labels == {"node": "node-1", "gpu": "2"}


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    def encoded(seed: int) -> list[bytes]:
        return [encode_batch(b) for b in run(small(duration=200, seed=seed)).batches]

    first = encoded(5)
    assert first == encoded(5)
    assert first != encoded(6)


def test_every_batch_survives_the_wire_format() -> None:
    trace = run(load_scenario(builtin_scenario("demo")), t0=1.7e9)
    for batch in trace.batches:
        parsed = parse_batch(decode_json(encode_batch(batch)))
        assert parsed.source == batch.source and len(parsed.events) == len(batch.events)
    assert min(b.frames[0].ts for b in trace.batches if b.frames) == 1.7e9 + 1
    assert all(e.ts >= 1.7e9 for e in trace.all_events)


def test_node_batches_follow_the_signal_contract() -> None:
    trace = run(small(duration=60))
    batch = next(b for b in trace.batches if b.source == "node-2")
    gpu, host, svc = batch.frames
    assert gpu.metrics == list(GPU_METRICS) and host.metrics == list(NODE_METRICS)
    assert svc.metrics == list(SERVICE_METRICS)
    assert [e["gpu"] for e in gpu.entities] == ["0", "1", "2", "3"]
    assert gpu.entities[0]["uuid"].startswith("GPU-") and gpu.entities[0]["job"] == "chat"
    assert "job" not in gpu.entities[3]
    assert host.entities == [{"node": "node-2"}]
    assert svc.entities == [{"service": "chat", "model": "chat", "version": "v3", "node": "node-2"}]
    sdk = [b for b in trace.batches if b.source == "sdk:train"]
    assert sdk and all(r.job == "train" for b in sdk for r in b.training)
    assert set(sdk[-1].training[0].metrics) == {
        "loss",
        "grad_norm",
        "step_seconds",
        "data_wait_seconds",
        "tokens_per_second",
        "samples_per_second",
        "learning_rate",
        "collective_arrival_skew_seconds",
        "memory_allocated_bytes",
        "memory_reserved_bytes",
        "memory_fragmentation_ratio",
        "alloc_retries_total",
    }


def test_coarser_interval_still_beats_every_second() -> None:
    trace = run(small(duration=100).replace("interval: 1", "interval: 5"))
    assert trace.ticks == 20
    beats = np.array(trace.beats("train", 2))
    assert len(beats) >= 95 and np.allclose(np.diff(beats), 1.0)


def test_one_tick_per_interval_over_the_whole_scenario() -> None:
    scenario = load_scenario(builtin_scenario("demo"))
    times = [tick.t for tick in Simulator(scenario).ticks()]
    assert len(times) == round(scenario.duration / scenario.interval)
    assert np.allclose(np.diff(times), scenario.interval)
