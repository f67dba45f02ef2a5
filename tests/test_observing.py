"""The hub's observe stage: acknowledged batches reach the detectors and observers a tick at once,
in order, none skipped, before the next evaluation, and one failing observer stops nothing."""

from __future__ import annotations

import threading
import warnings

import numpy as np

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.ingest.overload import OverloadMonitor, OverloadSettings
from gpuscope.model import Batch, Finding, Frame
from gpuscope.observing import ObserveStage
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.api import HubApi


def _batch(k: int, node: str = "node-0") -> Batch:
    frame = Frame(float(k), ["gpu_utilization_percent"], [{"node": node, "gpu": "0"}], np.array([[float(k)]]))
    return Batch(f"agent-{node}", frames=[frame], batch_id=f"{node}-{k}")


class Seen(Detector):
    """Records every frame's timestamp it sees, and what it had seen when evaluated."""

    def __init__(self) -> None:
        self.frames: list[float] = []
        self.at_evaluation: list[list[float]] = []

    def on_frame(self, frame: Frame) -> None:
        self.frames.append(frame.ts)

    def evaluate(self, now: float) -> list[Finding]:
        self.at_evaluation.append(list(self.frames))
        return []


class Raises(Detector):
    def on_frame(self, frame: Frame) -> None:
        raise RuntimeError("a broken detector")

    def evaluate(self, now: float) -> list[Finding]:
        raise RuntimeError("a broken detector")


def _hub() -> tuple[Hub, Seen]:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    seen = Seen()
    hub.detection = DetectionEngine([Raises(), seen])
    return hub, seen


def test_evaluate_first_lets_the_detectors_see_every_acknowledged_batch_in_order() -> None:
    hub, seen = _hub()
    for k in range(5):
        assert not hub.ingest(_batch(k)).duplicate
    assert hub.ingest(_batch(3)).duplicate  # a retry: stored once, observed once
    assert seen.frames == []  # acknowledged, queued: the request did not observe it
    assert hub.observing.backlog()[0] == 5
    hub.evaluate(10.0)
    assert seen.at_evaluation == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    hub.ingest(_batch(5))
    hub.evaluate(11.0)
    assert seen.at_evaluation[-1] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert hub.observing.backlog() == (0, 0.0)
    assert hub.counters.get("observe_batches") == 6 and hub.counters.get("observe_ticks") == 2
    hub.store.close()


def test_a_detector_or_observer_that_raises_stops_neither_the_others_nor_the_next_ticks() -> None:
    hub, seen = _hub()
    heard: list[str | None] = []

    def flaky(batch: Batch) -> None:
        if batch.batch_id == "node-0-1":
            raise ValueError("an observer failing on one batch")
        heard.append(batch.batch_id)

    hub.add_observer(flaky)
    hub.add_observer(lambda batch: heard.append(f"after {batch.batch_id}"))
    for k in range(3):
        hub.ingest(_batch(k))
    hub.evaluate(10.0)
    hub.ingest(_batch(3))
    hub.evaluate(11.0)
    assert seen.frames == [0.0, 1.0, 2.0, 3.0]  # the raising detector before it blinds nothing
    assert [h for h in heard if not h.startswith("after")] == ["node-0-0", "node-0-2", "node-0-3"]
    assert [h for h in heard if h.startswith("after")] == [f"after node-0-{k}" for k in range(4)]
    assert hub.counters.get("observe_errors_test_observing") == 1
    assert hub.detection.counters.get("detect_errors_Raises_on_frame") == 4
    # the productivity model saw every batch too
    assert hub.productivity.gpus
    hub.store.close()


def test_a_failing_tick_observer_is_counted_and_the_next_tick_is_observed() -> None:
    stage = ObserveStage(Counters())
    ticks: list[list[int]] = []

    def fails_once(batches: list[Batch]) -> None:
        if not ticks:
            ticks.append([])
            raise RuntimeError("first tick fails")
        ticks.append([int(b.frames[0].ts) for b in batches])

    later: list[int] = []
    stage.add("fails_once", fails_once)
    stage.add("later", lambda batches: later.extend(int(b.frames[0].ts) for b in batches))
    stage.put(_batch(0))
    assert stage.drain() == 1
    stage.put(_batch(1))
    stage.put(_batch(2))
    assert stage.drain() == 2
    assert ticks == [[], [1, 2]] and later == [0, 1, 2]
    assert stage.counters.get("observe_errors_fails_once") == 1


def test_the_stage_is_bounded_a_full_queue_is_drained_by_the_request_that_fills_it() -> None:
    stage = ObserveStage(Counters(), max_pending=4)
    seen: list[int] = []
    stage.add("seen", lambda batches: seen.extend(int(b.frames[0].ts) for b in batches))
    for k in range(10):
        stage.put(_batch(k))
        assert stage.backlog()[0] <= 4
    stage.drain()
    assert seen == list(range(10))
    assert stage.counters.get("observe_backpressure_drains") == 2


def test_concurrent_requests_lose_nothing_and_each_sender_stays_in_order() -> None:
    stage = ObserveStage(Counters(), max_pending=64)
    seen: list[tuple[str, int]] = []
    stage.add("seen", lambda batches: seen.extend((b.source, int(b.frames[0].ts)) for b in batches))
    stop = threading.Event()

    def evaluator() -> None:  # drains as the evaluation does, while requests keep coming
        while not stop.is_set():
            stage.drain()

    def sender(node: str) -> None:
        for k in range(300):
            stage.put(_batch(k, node))

    drainer = threading.Thread(target=evaluator)
    drainer.start()
    senders = [threading.Thread(target=sender, args=(f"n{i}",)) for i in range(8)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    drainer.join()
    stage.drain()
    assert len(seen) == 8 * 300 and len(set(seen)) == 8 * 300
    for i in range(8):
        assert [k for source, k in seen if source == f"agent-n{i}"] == list(range(300))


def test_what_an_observer_derives_and_stores_is_seen_before_the_same_evaluation() -> None:
    hub, seen = _hub()

    def derive(batch: Batch) -> None:
        if batch.source != "derived":
            ts = batch.frames[0].ts + 0.5
            frame = Frame(ts, ["x"], [{"node": "node-0", "gpu": "0"}], np.array([[1.0]]))
            hub.ingest(Batch("derived", frames=[frame]))

    hub.add_observer(derive)
    hub.ingest(_batch(1))
    assert hub.observing.drain() == 1
    assert seen.frames == [1.0]
    assert hub.observing.backlog()[0] == 1  # what the observer stored, queued for the next drain
    hub.ingest(_batch(2))
    # the evaluation sees it, and what the observer derives from the next batch, as if each
    # request had observed its own batch
    hub.evaluate(5.0)
    assert seen.at_evaluation == [[1.0, 1.5, 2.0, 2.5]]
    hub.store.close()


def test_batches_waiting_for_the_detectors_past_the_limit_put_the_hub_behind() -> None:
    overload = OverloadMonitor(OverloadSettings(max_lag_s=2.0, retry_after_s=1.0))
    overload.observe_lag(100.0, 1.5)
    assert not overload.behind(100.0)
    overload.observe_lag(101.0, 2.5)  # acknowledged 2.5 s past the evaluation that should have seen them
    assert overload.behind(101.0) and overload.status(101.0)["observe_lag_seconds"] == 2.5
    assert overload.admit(101.0).ticket is None  # shed, as for any other sign of lag
    overload.observe_lag(102.0, 0.0)
    assert overload.behind(102.0)  # until the settle time after the last sign
    assert not overload.behind(101.0 + overload.settings.settle)


class CountingHub(Hub):
    """A real hub that counts its settles."""

    settles = 0

    def settle(self) -> int:
        self.settles += 1
        return super().settle()


def test_the_evaluation_and_a_read_both_settle_through_the_one_hub_call() -> None:
    hub = CountingHub(DuckDBStore(":memory:", durable=False))
    seen = Seen()
    hub.detection = DetectionEngine([seen])
    client = TestClient(HubApi(hub, clock=lambda: 10.0).app)
    try:
        assert not hub.unsettled() and hub.settle() == 0
        hub.ingest(_batch(1))
        assert hub.unsettled()
        hub.settles = 0
        assert client.get("/api/v1/alerts").status_code == 200
        assert hub.settles == 1 and not hub.unsettled() and seen.frames == [1.0]
        assert client.get("/api/v1/alerts").status_code == 200
        assert hub.settles == 1  # nothing waited: the read did not leave its event loop
        hub.ingest(_batch(2))
        hub.evaluate(10.0)
        assert hub.settles == 2 and seen.at_evaluation[-1] == [1.0, 2.0]
    finally:
        hub.store.close()
