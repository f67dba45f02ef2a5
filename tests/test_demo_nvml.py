"""The demo's path for node telemetry: simulator → fake NVML → real NVML collector → agent → hub.

Runs a short scenario in virtual time (no sleeping, no HTTP: each agent round goes through the
wire format into an in-process hub) with a thermal throttle and an XID 79 whose GPU is reset
after 40 s, and checks what the hub made of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from gpuscope.agent.agent import Agent
from gpuscope.demo import sim_nvml_nodes
from gpuscope.hub import Hub
from gpuscope.ingest.payload import batch_to_json, parse_batch
from gpuscope.model import Alert, Batch
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import parse_scenario
from gpuscope.store.duckdb import DuckDBStore

SCENARIO = """
name: nvml-path
seed: 5
duration: 110
interval: 1
cluster: {nodes: 2, gpus_per_node: 4, gpu_model: H100-SXM5-80GB, price_per_gpu_hour: 2.5}
jobs:
  - {name: train, kind: training, nodes: [node-0, node-1], step_time: 1.0, checkpoint_every: 30}
faults:
  - {at: 10, kind: thermal_throttle, target: {node: node-0, gpu: 1}, params: {temp: 92}, duration: 90}
  - {at: 20, kind: xid, target: {node: node-1, gpu: 2}, params: {code: 79}, duration: 40}
"""
T0 = 1_700_000_000.0
XID_AT, RESET_AT = T0 + 20, T0 + 60


class Played:
    def __init__(self, hub: Hub, store: DuckDBStore, sent: list[Batch], counters: dict[str, dict[str, int]]):
        self.hub, self.store, self.sent, self.counters = hub, store, sent, counters

    def alerts(self, rule: str) -> list[Alert]:
        return [a for a in self.hub.alerts.all() if a.rule == rule]


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Played]:
    tmp = tmp_path_factory.mktemp("demo-nvml")
    sim = Simulator(parse_scenario(SCENARIO), t0=T0)
    nodes = sim_nvml_nodes(sim, tmp / "proc")
    now = [T0]
    agents = {
        name: Agent(
            "http://127.0.0.1:9",  # never contacted: rounds go to the hub below
            name,
            node.collectors,
            clock=lambda: now[0],
            spool_dir=tmp / "spool" / name,
            fsync=False,
        )
        for name, node in nodes.items()
    }
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store)
    sent: list[Batch] = []
    try:
        for tick in sim.ticks():
            now[0] = T0 + tick.t
            for name, batch in tick.node_batches.items():
                nodes[name].feed(batch)
                sent.append(parse_batch(batch_to_json(agents[name].run_once(now[0]))))
                hub.ingest(sent[-1])
            hub.evaluate(now[0])
        counters = {name: node.counters.snapshot() for name, node in nodes.items()}
        yield Played(hub, store, sent, counters)
    finally:
        for agent in agents.values():
            agent.close()
        store.close()


def _gpu_rows(batch: Batch) -> list[dict[str, str]]:
    return [e for f in batch.frames if "gpu_utilization_percent" in f.metrics for e in f.entities]


def test_fatal_xid_lost_gpu_and_thermal_throttle_fire_on_the_right_gpu(played: Played) -> None:
    rules = ("gpu_xid_fatal", "gpu_lost", "gpu_thermal_throttle")
    fired = {(a.rule, a.entity.get("node"), a.entity.get("gpu")) for a in played.hub.alerts.all()}
    assert {f for f in fired if f[0] in rules} == {
        ("gpu_xid_fatal", "node-1", "2"),
        ("gpu_lost", "node-1", "2"),
        ("gpu_thermal_throttle", "node-0", "1"),
    }
    (lost,) = played.alerts("gpu_lost")
    assert lost.started_at == XID_AT
    assert lost.resolved_at is not None and RESET_AT <= lost.resolved_at <= RESET_AT + 10  # the GPU is back
    (throttle,) = played.alerts("gpu_thermal_throttle")
    assert T0 + 10 < throttle.started_at < T0 + 90


def test_the_xid_and_the_loss_reach_the_hub_once_from_nvml(played: Played) -> None:
    for kind in ("xid", "gpu_lost"):
        (event,) = played.store.events(T0, T0 + 200, kind=kind)
        assert event.data["source"] == "nvml" and event.ts == XID_AT
        assert (event.labels["node"], event.labels["gpu"]) == ("node-1", "2")
    (xid,) = played.store.events(T0, T0 + 200, kind="xid")
    assert xid.data["code"] == 79
    assert played.counters["node-1"] == {"events_to_nvml": 2, "gpus_lost": 1, "gpus_restored": 1}


def test_gpu_rows_come_from_nvml_once_per_round_with_their_job(played: Played) -> None:
    for batch in played.sent:
        rows = _gpu_rows(batch)
        assert len(rows) == len({r["gpu"] for r in rows}), f"a GPU twice in {batch.batch_id}"
        # only the NVML collector reports the processes on a GPU
        assert any("gpu_process_memory_used_bytes" in f.metrics for f in batch.frames) == any(
            "job" in r for r in rows
        )
    mid = [b for b in played.sent if b.source == "node-0" and T0 + 40 <= b.frames[0].ts <= T0 + 50]
    assert mid and all(r.get("job") == "train" for b in mid for r in _gpu_rows(b))
    snapshot = played.store.snapshot(["gpu_process_memory_used_bytes"])
    owners = {(r["labels"]["node"], r["labels"]["gpu"]): r["labels"] for r in snapshot}
    assert len(owners) == 8 and all(o["job"] == "train" and "pid" in o for o in owners.values())


def test_the_gpu_is_gone_while_lost_and_back_after_its_reset(played: Played) -> None:
    seen = Counter[str]()
    for batch in played.sent:
        if batch.source != "node-1":
            continue
        ts = batch.frames[0].ts
        present = any(r["gpu"] == "2" for r in _gpu_rows(batch))
        if XID_AT <= ts < RESET_AT:
            seen["absent" if not present else "present while lost"] += 1
        elif ts >= RESET_AT:
            seen["back" if present else "missing after reset"] += 1
    assert seen["absent"] == RESET_AT - XID_AT and seen["back"] > 40
    assert not seen["present while lost"] and not seen["missing after reset"]
    back = [
        r
        for b in played.sent
        if b.source == "node-1" and b.frames[0].ts > RESET_AT + 20
        for r in _gpu_rows(b)
        if r["gpu"] == "2"
    ]
    assert any(r.get("job") == "train" for r in back)  # the job resumed on it
