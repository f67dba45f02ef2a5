"""A simulated node read through the real NVML collector: the fake's reset, the event hand-off,
the split of a simulated batch between NVML and the simulated rest, and job attribution."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuscope.collect.base import Collected
from gpuscope.collect.fake_nvml import FakeNvml
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.sim_node import SimNvmlNode, is_gpu_frame
from gpuscope.collect.sim_nvml import apply_event, apply_frame
from gpuscope.model import Batch, Event, Frame


def gpu_rows(got: Collected) -> dict[str, dict[str, object]]:
    """GPU index -> labels and values of the round's whole-GPU frame."""
    f = next(f for f in got.frames if "gpu_utilization_percent" in f.metrics)
    return {
        e["gpu"]: {**e, **{m: float(f.values[i, j]) for j, m in enumerate(f.metrics)}}
        for i, e in enumerate(f.entities)
    }


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.healthy(4)


@pytest.fixture
def nvml(fake: FakeNvml) -> Iterator[NvmlCollector]:
    c = NvmlCollector("n", lib=fake, slow_every=1, watch_events=True)
    yield c
    c.close()


def test_a_reset_gpu_comes_back_with_its_volatile_ecc_cleared(fake: FakeNvml, nvml: NvmlCollector) -> None:
    fake.ecc_errors(2, corrected=5, uncorrected=1)
    fake.gpus[2].retired_pending = True
    nvml.collect(1.0)
    fake.lose(2)
    got = nvml.collect(2.0)
    assert [(e.kind, e.labels["gpu"]) for e in got.events if e.kind == "gpu_lost"] == [("gpu_lost", "2")]
    assert "2" not in gpu_rows(got)
    assert "2" not in gpu_rows(nvml.collect(3.0))  # still lost: asked, not read, no second event
    fake.restore(2)
    back = nvml.collect(4.0)
    row = gpu_rows(back)["2"]
    assert row["gpu_ecc_sbe_volatile_total"] == 0 and row["gpu_ecc_dbe_volatile_total"] == 0
    assert row["gpu_ecc_sbe_aggregate_total"] == 5 and row["gpu_ecc_dbe_aggregate_total"] == 1
    assert row["gpu_retired_pages_pending"] == 0
    assert not [e for e in back.events if e.kind == "gpu_lost"] and "2" not in nvml.lost
    fake.lose(2)  # and a second loss is reported again
    assert [e.kind for e in nvml.collect(5.0).events if e.kind == "gpu_lost"] == ["gpu_lost"]


def test_a_gpu_answering_with_another_uuid_stays_lost(fake: FakeNvml, nvml: NvmlCollector) -> None:
    nvml.collect(1.0)
    fake.lose(1)
    nvml.collect(2.0)
    fake.gpus[1].uuid, fake.gpus[1].lost = "GPU-swapped", False  # another board in the slot
    assert "1" not in gpu_rows(nvml.collect(3.0))


def test_wait_events_taken_returns_once_the_event_thread_passed_them_on(
    fake: FakeNvml, nvml: NvmlCollector
) -> None:
    nvml.collect(1.0)  # registers the GPUs for events
    assert fake.wait_events_taken(0.01)  # nothing posted: nothing to wait for
    fake.xid(3, 79)
    fake.ecc_errors(0, uncorrected=2)
    assert fake.wait_events_taken(5.0)
    got = nvml.collect(2.0).events
    assert sorted((e.kind, e.labels["gpu"]) for e in got) == [("ecc_dbe", "0"), ("xid", "3")]


def test_simulated_dbe_retired_pages_and_nvlink_traffic_read_back(
    fake: FakeNvml, nvml: NvmlCollector
) -> None:
    nvml.collect(0.0)
    assert apply_event(fake, Event(0.5, "ecc_dbe", {"node": "n", "gpu": "1"}, {"count": 2}))
    assert fake.wait_events_taken(5.0)  # the event thread has it: the next round reports it
    metrics = [
        "gpu_utilization_percent",
        "gpu_retired_pages_dbe",
        "gpu_retired_pages_pending",
        "gpu_nvlink_recovery_errors_total",
        "gpu_nvlink_tx_bytes_per_second",
    ]
    events = []
    for ts in (1.0, 2.0):
        frame = Frame(
            ts, metrics, [{"node": "n", "gpu": "1"}], np.array([[90.0, 3.0, 1.0, 37.0, 18 * 2**30]])
        )
        apply_frame(fake, frame, dt=1.0)
        got = nvml.collect(ts)
        events += got.events
    row = gpu_rows(got)["1"]
    assert row["gpu_retired_pages_dbe"] == 3 and row["gpu_retired_pages_pending"] == 1
    assert row["gpu_nvlink_recovery_errors_total"] == 37
    assert row["gpu_nvlink_tx_bytes_per_second"] == pytest.approx(18 * 2**30, rel=1e-3)
    assert fake.gpus[1].ecc[(1, 1)] == 2
    dbe = [e for e in events if e.kind == "ecc_dbe"]
    assert [(e.labels["gpu"], e.data["count"]) for e in dbe] == [("1", 2)]


def _batch(ts: float, gpus: dict[str, str | None], events: list[Event]) -> Batch:
    """A simulated node's batch: a GPU frame (GPU -> job), a node frame and ``events``."""
    entities = [{"node": "node-0", "gpu": g, **({"job": j} if j else {})} for g, j in gpus.items()]
    metrics = ["gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_temp_celsius"]
    values = np.array([[95.0, 60 * 2**30, 70.0 + int(g)] for g in gpus])
    return Batch(
        source="node-0",
        frames=[
            Frame(ts, metrics, entities, values),
            Frame(ts, ["node_cpu_percent"], [{"node": "node-0"}], np.array([[12.0]])),
        ],
        events=events,
        batch_id=f"node-0:{ts}",
    )


def test_a_batch_splits_between_nvml_and_the_simulated_rest(tmp_path: Path) -> None:
    node = SimNvmlNode("node-0", 4, tmp_path / "proc", uuids=[f"GPU-sim-{i}" for i in range(4)])
    try:
        xid = Event(10.0, "xid", {"node": "node-0", "gpu": "3"}, {"code": 79})
        lost = Event(10.0, "gpu_lost", {"node": "node-0", "gpu": "3"}, {"reason": "off the bus"})
        other = Event(10.0, "kernel_panic", {"node": "node-0"}, {})
        node.feed(_batch(10.0, {"0": "train", "1": "train", "2": None}, [xid, lost, other]))
        nvml, rest = (c.collect(10.0) for c in node.collectors)
        assert not [f for f in rest.frames if is_gpu_frame(f)]  # the simulated GPU frame stays home
        assert [f.metrics for f in rest.frames] == [["node_cpu_percent"]]
        assert [e.kind for e in rest.events] == ["kernel_panic"]
        rows = gpu_rows(nvml)
        assert sorted(rows) == ["0", "1", "2"]  # GPU 3 lost
        assert rows["0"]["job"] == "train" and rows["1"]["job"] == "train" and "job" not in rows["2"]
        assert rows["0"]["uuid"] == "GPU-sim-0" and rows["2"]["gpu_temp_celsius"] == 72
        kinds = sorted((e.kind, e.labels["gpu"], e.data["source"]) for e in nvml.events)
        assert kinds == [("gpu_lost", "3", "nvml"), ("xid", "3", "nvml")]
        assert next(e for e in nvml.events if e.kind == "xid").ts == 10.0  # simulated time
        procs = next(f for f in nvml.frames if "gpu_process_memory_used_bytes" in f.metrics)
        assert sorted((e["gpu"], e["job"]) for e in procs.entities) == [("0", "train"), ("1", "train")]
        first_pid = procs.entities[0]["pid"]

        # the job moves off GPU 0 and another starts there; GPU 3 is back after its reset
        node.feed(_batch(11.0, {"0": "eval", "1": "train", "2": None, "3": "train"}, []))
        rows = gpu_rows(node.nvml.collect(11.0))
        assert (
            sorted(rows) == ["0", "1", "2", "3"]
            and rows["0"]["job"] == "eval"
            and rows["3"]["job"] == "train"
        )
        assert not (tmp_path / "proc" / first_pid).exists()  # the old process is gone from procfs
        assert node.counters.snapshot() == {
            "gpus_lost": 1,
            "events_to_nvml": 2,
            "events_passed_on": 1,
            "gpus_restored": 1,
        }
    finally:
        node.close()


def test_bad_shapes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 GPU UUIDs for 4 GPUs"):
        SimNvmlNode("node-0", 4, tmp_path, uuids=["a", "b"])
    with pytest.raises(ValueError, match="at least one GPU"):
        SimNvmlNode("node-0", 0, tmp_path)
