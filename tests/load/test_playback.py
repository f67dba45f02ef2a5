"""The load generator's pre-encoded traffic: what the hub receives stays a plausible, valid fleet
across the ring's wrap-around, and injected faults still reach it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpuscope.ingest.frame import decode_frame
from gpuscope.loadgen.playback import Playback
from gpuscope.loadgen.traffic import FleetShape, scenario_doc
from gpuscope.model import Batch
from gpuscope.sim import gpus
from gpuscope.sim.cluster import Simulator

T0 = 1_800_000_000.0
SHAPE = FleetShape(nodes=40, gpus_per_node=2, job_nodes=4)


def play(
    faults: list[dict[str, object]], duration: int = 14, ring: int = 5
) -> tuple[Playback, list[list[Batch]]]:
    playback = Playback(scenario_doc(SHAPE, duration, faults), ring=ring, warmup=12)
    ticks = []
    for k, (due, out) in enumerate(playback.ticks(T0)):
        assert due == T0 + k + 1
        ticks.append([decode_frame(o.body) for o in out])  # every body a valid frame
    return playback, ticks


def test_every_sender_every_tick_with_times_ids_counters_and_steps_moving_on() -> None:
    playback, ticks = play(faults=[])
    sim = list(Simulator(playback.scenario, t0=T0).ticks())
    assert {b.source for t in ticks for b in t} == {
        *(n for t in sim for n in t.node_batches),
        *(b.source for t in sim for b in t.sdk_batches),
    }
    senders = set(sim[-1].node_batches)  # every node, every tick
    ids = Counter(b.batch_id for tick in ticks for b in tick)
    assert max(ids.values()) == 1 and len(ids) == sum(len(t) for t in ticks)  # unique over the wraps
    counters: dict[tuple[str, str, str], float] = {}
    steps: dict[tuple[str, int], int] = {}
    once: Counter[tuple[str, str, str]] = Counter()
    for k, tick in enumerate(ticks):
        assert {b.source for b in tick} >= senders
        for b in tick:
            for f in b.frames:
                assert f.ts == T0 + k + 1
                for j, m in enumerate(f.metrics):
                    if not m.endswith("_total"):
                        continue
                    for e, v in zip(f.entities, f.values[:, j], strict=True):
                        key = (b.source, str(sorted(e.items())), m)
                        assert not v < counters.get(key, -np.inf), (k, key)  # never a counter reset
                        counters[key] = v
            for t in b.training:
                assert T0 + k < t.ts <= T0 + k + 1
                assert t.step >= steps.get((t.job, t.rank), 0)  # steps never go back at a wrap
                steps[(t.job, t.rank)] = t.step
            for e in b.events:
                assert T0 <= e.ts <= T0 + k + 1  # never ahead of its tick
                once.update({(b.source, e.kind, str(e.labels))} if e.kind != "heartbeat" else set())
    assert counters and steps
    assert once and max(once.values()) == 1  # job_started is not sent again on every turn
    assert playback.replayed == len({b.source for t in ticks for b in t})  # no faults: nothing live


def test_faults_are_played_live_on_the_fleets_node_names() -> None:
    faults = [
        {"at": 6, "kind": "xid", "target": {"node": "node-13", "gpu": 1}},
        {"at": 6, "kind": "node_down", "target": {"node": "node-30"}},
    ]
    playback, ticks = play(faults)
    assert playback.replayed < len({b.source for b in ticks[0]})
    xids = [(k, e.labels) for k, tick in enumerate(ticks) for b in tick for e in b.events if e.kind == "xid"]
    assert xids and all(labels["node"] == "node-13" and labels["gpu"] == "1" for _, labels in xids)
    assert min(k for k, _ in xids) >= 5
    sent_by_30 = [k for k, tick in enumerate(ticks) if any(b.source == "node-30" for b in tick)]
    assert sent_by_30 and max(sent_by_30) < 7  # the node went down and stayed silent
    # a GPU keeps one identity: the fleet's uuid on the node's own name, never another node's
    owners: dict[str, set[str]] = {}
    for tick in ticks:
        for b in tick:
            for f in b.frames:
                for e in f.entities:
                    if "uuid" in e:
                        owners.setdefault(e["uuid"], set()).add(e["node"])
    assert owners and all(len(nodes) == 1 for nodes in owners.values())
    # the live jobs' placements name the fleet's nodes (node-12..15 run the job of node-13)
    started = [
        e.data
        for tick in ticks
        for b in tick
        for e in b.events
        if e.kind == "job_started" and e.labels["job"] == "job-3"
    ]
    assert started and {row[1] for row in started[0]["placement"]} == {
        "node-12",
        "node-13",
        "node-14",
        "node-15",
    }


def test_a_run_within_the_ring_without_warm_up_is_the_simulators_own_ticks() -> None:
    doc = scenario_doc(SHAPE, 8, [{"at": 3, "kind": "xid", "target": {"node": "node-5", "gpu": 0}}])
    playback = Playback(doc, ring=10, warmup=0)

    def summary(batches: list[Batch]) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for b in batches:
            out.update((b.source, f"event:{e.kind}") for e in b.events)
            out.update((b.source, f"training:{t.rank}:{t.step}") for t in b.training)
            out.update((b.source, f"frame:{f.ts}:{f.values.shape}") for f in b.frames)
        return out

    sim = Simulator(playback.scenario, t0=T0).ticks()
    for (_, out), tick in zip(playback.ticks(T0), sim, strict=True):
        played = summary([decode_frame(o.body) for o in out])
        assert played == summary([*tick.node_batches.values(), *tick.sdk_batches])


JOB_3 = {"node-12", "node-13", "node-14", "node-15"}  # the faulty GPU's job, played live
ERRORS = ("gpu_nvlink_crc_errors_total", "gpu_pcie_replay_total")


def _per_gpu(ticks: list[list[Batch]], metric: str) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for tick in ticks:
        for b in tick:
            for f in b.frames:
                if metric in f.metrics:
                    j = f.metrics.index(metric)
                    for e, v in zip(f.entities, f.values[:, j], strict=True):
                        out.setdefault((e["node"], e["gpu"]), []).append(float(v))
    return out


def test_a_healthy_gpus_rare_errors_are_not_replayed_every_turn_but_an_injected_fault_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # errors frequent enough that many GPUs log one in a 5-tick ring, yet none on every tick: a
    # 1,024-node ring of 30 ticks at the real rates has a handful of such GPUs, and replayed they
    # logged one error per 30-s turn, which fired nvlink_errors on 5 healthy GPUs in a load run
    monkeypatch.setattr(gpus, "NVLINK_CRC_RATE", 0.08)
    monkeypatch.setattr(gpus, "PCIE_REPLAY_RATE", 0.08)
    fault = {"at": 2, "kind": "nvlink_errors", "target": {"node": "node-13", "gpu": 1}}
    _, ticks = play([fault], duration=20, ring=5)
    ring = 5
    for metric in ERRORS:
        series = _per_gpu(ticks, metric)
        healthy = {k: v for k, v in series.items() if k[0] not in JOB_3}
        assert sum(v[ring - 1] > v[0] for v in healthy.values()) >= 5  # the ring holds errors
        for key, v in healthy.items():
            # after the first turn, a replayed GPU's error count stays where the ring left it
            assert v[ring - 1 :] == [v[ring - 1]] * (len(v) - ring + 1), (metric, key, v)
    faulty = _per_gpu(ticks, "gpu_nvlink_crc_errors_total")[("node-13", "1")]
    assert faulty[-1] - faulty[2 * ring] >= 5  # played live: the injected fault's errors go on
    energy = _per_gpu(ticks, "gpu_energy_joules_total")
    assert all(np.all(np.diff(v) > 0) for v in energy.values())  # a flowing counter still flows
