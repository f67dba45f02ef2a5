"""The agent: rounds, aligned loop on a virtual clock, restart with a spool, the --once JSON."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
import orjson
import pytest

from agent.fakes import FakeClock, FakeHub
from gpuscope.agent.agent import Agent, collect_once_json, render_labels
from gpuscope.collect.base import Collected, Collector
from gpuscope.collect.host import HostCollector
from gpuscope.model import Event, Frame, TrainingRecord

PROC = Path(__file__).parents[1] / "collect" / "fixtures" / "proc"


class GpuStub(Collector):
    """Two GPUs whose utilisation is the round's timestamp, so rounds can be told apart."""

    name: ClassVar[str] = "gpu_stub"

    def collect(self, now: float) -> Collected:
        entities = [{"node": self.node, "gpu": str(g), "job": "llm"} for g in range(2)]
        values = np.array([[now, 60.0], [now, np.nan]])
        return Collected(
            frames=[Frame(now, ["gpu_utilization_percent", "gpu_temp_celsius"], entities, values)]
        )


class Script(Collector):
    """Runs ``on_round(round_number)`` inside each round: to spend virtual time, move the clock,
    or stop the loop."""

    name: ClassVar[str] = "script"

    def __init__(self, node: str, on_round: Callable[[int], None]) -> None:
        super().__init__(node)
        self.on_round, self.rounds = on_round, 0

    def collect(self, now: float) -> Collected:
        self.rounds += 1
        self.on_round(self.rounds)
        return Collected()


class Flaky(Collector):
    name: ClassVar[str] = "flaky"

    def collect(self, now: float) -> Collected:
        raise OSError("nvml: GPU is lost")


class SimNode(Collector):
    """Stands in for a simulated node: events and training records ride in the agent's batch."""

    name: ClassVar[str] = "sim"

    def collect(self, now: float) -> Collected:
        return Collected(
            events=[Event(now, "xid", {"node": self.node, "gpu": "3"}, {"code": 79})],
            training=[TrainingRecord(now, "llm", 0, 10, {"loss": float("nan")}, {"node": self.node})],
        )


def make_agent(
    tmp_path: Path, hub: FakeHub, clock: FakeClock, collectors: list[Collector], **kw: object
) -> Agent:
    return Agent(
        "http://hub.test",
        "node-3",
        collectors,
        interval=kw.pop("interval", 1.0),  # type: ignore[arg-type]
        spool_dir=tmp_path / "spool",
        transport=hub.transport,
        clock=clock,
        sleep=clock.sleep,
        fsync=False,
        **kw,  # type: ignore[arg-type]
    )


def test_run_once_builds_one_batch_from_every_collector(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    agent = make_agent(tmp_path, hub, clock, [GpuStub("node-3"), Flaky("node-3"), SimNode("node-3")])
    first = agent.run_once()
    assert first.source == "node-3"
    assert [e.kind for e in first.events] == ["agent_started", "xid"]
    started = first.events[0]
    assert started.labels == {"node": "node-3"}
    assert started.data["collectors"] == ["gpu_stub", "flaky", "sim"]
    assert first.sample_count == 3
    assert len(first.training) == 1
    second = agent.run_once()
    assert [e.kind for e in second.events] == ["xid"]  # agent_started only once
    assert first.batch_id == f"node-3:{agent.boot_id}:0"
    assert second.batch_id == f"node-3:{agent.boot_id}:1"
    assert hub.requests == []  # run_once does not send
    stats = agent.stats()
    assert stats["rounds"] == 2 and stats["collector_errors"] == 2
    assert stats["collector_errors.flaky.OSError"] == 2
    agent.close()


def test_step_sends_a_valid_payload_with_every_record(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    agent = make_agent(tmp_path, hub, clock, [GpuStub("node-3"), SimNode("node-3")])
    agent.step()
    (stored,) = hub.stored  # parsed by the real ingest parser in the fake hub
    assert stored.frames[0].entities[0] == {"node": "node-3", "gpu": "0", "job": "llm"}
    assert np.isnan(stored.frames[0].values[1, 1])
    assert np.isnan(stored.training[0].metrics["loss"])  # a NaN loss is a signal and survives
    stats = agent.stats()
    assert stats["batches_sent"] == 1 and stats["samples_sent"] == 3 and stats["hub_ok"] == 1
    agent.close()


def test_run_is_aligned_to_the_interval_and_never_drifts(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    clock.t = 1000.3
    # round 3 overruns by 0.7 s (the next still starts on time); round 6 by 2.5 s: the round
    # due at 1007 cannot run, the one due at 1008 runs late, and 1009 is on time again
    costs = {3: 0.7, 6: 2.5}
    stop = threading.Event()

    def on_round(n: int) -> None:
        clock.sleep(costs.get(n, 0.1))
        if n == 8:
            stop.set()

    agent = make_agent(tmp_path, hub, clock, [GpuStub("node-3"), Script("node-3", on_round)])
    agent.run(stop)
    stamps = [b.frames[0].ts for b in hub.stored]
    assert stamps == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0, 1006.0, 1008.0, 1009.0]
    assert agent.stats()["rounds_missed"] == 1
    agent.close()


def test_clock_stepping_back_realigns_instead_of_stalling(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    clock.t = 10000.0
    stop = threading.Event()

    def on_round(n: int) -> None:
        if n == 2:
            clock.t -= 3600.0  # NTP stepped the wall clock back an hour
        if n == 4:
            stop.set()

    agent = make_agent(tmp_path, hub, clock, [GpuStub("node-3"), Script("node-3", on_round)])
    agent.run(stop)
    assert [b.frames[0].ts for b in hub.stored] == [10001.0, 10002.0, 6403.0, 6404.0]
    assert agent.stats()["clock_jumps"] == 1
    agent.close()


def test_restart_replays_the_spool_before_new_rounds(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    hub.down = True
    first = make_agent(tmp_path, hub, clock, [GpuStub("node-3")])
    spooled = [first.step(now=clock.t + i).batch_id for i in range(5)]
    assert first.stats()["spool_pending_batches"] == 5
    first.close()

    hub.down = False
    second = make_agent(tmp_path, hub, clock, [GpuStub("node-3")])
    assert second.boot_id != first.boot_id
    fresh = second.step().batch_id
    assert hub.stored_ids == [*spooled, fresh]
    assert second.stats()["batches_replayed"] == 6  # the new batch queued behind the old ones
    assert second.stats()["spool_pending_batches"] == 0
    second.close()


def test_invalid_settings_are_refused(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="interval must be a positive number"):
        make_agent(tmp_path, hub, clock, [], interval=0.0)
    with pytest.raises(ValueError, match="hub URL must start with"):
        Agent("hub.test", "n", [], spool_dir=tmp_path / "s", fsync=False)
    Agent("http://hub.test", "n", [], spool_dir=tmp_path / "s", fsync=False).close()  # spool was released


def test_collect_once_json_on_a_fixture_root(tmp_path: Path, clock: FakeClock) -> None:
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    sleeps: list[float] = []

    def sleep(dt: float) -> None:
        sleeps.append(dt)
        clock.sleep(dt)

    out = collect_once_json(
        [
            HostCollector("node-3", proc_root=str(root), disk_path=str(tmp_path)),
            Flaky("node-3"),
            SimNode("node-3"),
        ],
        clock=clock,
        sleep=sleep,
    )
    assert sleeps == [0.5]
    assert out["sources"] == ["host", "flaky", "sim"]
    host = out["entities"]["node=node-3"]
    assert host["node_tcp_retrans_segs_total"] == 348
    assert host["node_net_rx_bytes_per_second"] == 0.0  # two readings of unchanged counters
    assert "node_cpu_percent" not in host  # no CPU time passed between them: no percentage
    assert [e["kind"] for e in out["events"]] == ["xid", "xid"]  # both rounds' events
    assert out["training"][0]["metrics"] == {"loss": None}
    assert {(e["collector"], e["kind"]) for e in out["errors"]} == {("flaky", "OSError")}
    orjson.dumps(out)  # plain JSON all the way down


def test_render_labels_puts_standard_keys_first() -> None:
    assert (
        render_labels({"zone": "a", "gpu": "3", "node": "n1", "job": "llm"}) == "node=n1,gpu=3,job=llm,zone=a"
    )


def test_a_failing_round_is_counted_and_the_loop_goes_on(
    tmp_path: Path, hub: FakeHub, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = threading.Event()

    def on_round(n: int) -> None:
        if n == 3:
            stop.set()

    agent = make_agent(tmp_path, hub, clock, [GpuStub("node-3"), Script("node-3", on_round)])
    real_submit = agent.sender.submit
    calls: list[bytes] = []

    def submit(body: bytes, samples: int = 0, *, deadline: float | None = None) -> None:
        calls.append(body)
        if len(calls) == 1:
            raise RuntimeError("a bug in delivery")
        real_submit(body, samples, deadline=deadline)

    monkeypatch.setattr(agent.sender, "submit", submit)
    agent.run(stop)
    assert len(calls) == 3 and len(hub.stored) == 2
    assert agent.stats()["round_errors"] == 1
    agent.close()
