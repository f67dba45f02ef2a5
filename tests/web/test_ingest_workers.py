"""A hub whose ingest front runs in worker processes (``hub.ingest_workers``): every batch a
worker acknowledges reaches the store and the detectors exactly once, through a worker killed
mid-load, retries landing on another worker and a restart; the other routes are the hub's on the
same port; overload still sheds with 503 + Retry-After and raises one ``hub_overloaded``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
import yaml
from starlette.types import Receive, Scope, Send

from gpuscope.config import ConfigError, load_config
from gpuscope.counters import Counters
from gpuscope.ingest.frame import CONTENT_TYPE, encode_frame
from gpuscope.ingest.overload import (
    SENDER_HEADER,
    URGENT_EVENTS,
    URGENT_HEADER,
    OverloadMonitor,
    OverloadSettings,
    parse_sender,
)
from gpuscope.ingest.payload import Limits
from gpuscope.ingest.worker_state import WorkerState
from gpuscope.model import Batch, Event, Frame
from gpuscope.procmem import entries
from gpuscope.rules import HUB_OVERLOADED
from gpuscope.runtime import AssemblyError, Runtime, assemble
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.ingest_log import IngestLog
from gpuscope.web.auth import AuthSettings
from gpuscope.web.ingest_worker import (
    MAX_MESSAGE,
    REPORT,
    Control,
    Reporter,
    WorkerSpec,
    worker_clock,
)
from support import free_port, wait_until

NODES = 4
TICKS = 30
FRAME = {"content-type": CONTENT_TYPE}
JSON = {"content-type": "application/json"}


def _runtime(tmp_path: Path, workers: int = 2, evaluate: float | None = 0.2) -> Runtime:
    path = tmp_path / "hub.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{free_port()}",
                "storage": {"path": str(tmp_path / "hub.duckdb")},
                "hub": {"ingest_workers": workers},
            }
        )
    )
    return assemble(load_config(path), evaluate_interval=evaluate)


def _frame(node: str, k: int, start: float) -> bytes:
    values = np.array([[50.0 + k], [60.0 + k]])
    entities = [{"node": node, "gpu": "0"}, {"node": node, "gpu": "1"}]
    events = []
    if node == "node-0" and k == 7:
        events = [Event(start + k, "xid", {"node": node, "gpu": "1"}, {"code": 79})]
    batch = Batch(node, [Frame(start + k, ["gpu_util"], entities, values)], events, [], f"{node}:{k}")
    return encode_frame(batch)


def _sdk(k: int, start: float) -> bytes:
    record = {"ts": start + k, "job": "train", "rank": 0, "step": k, "metrics": {"loss": 1.0 / (k + 1)}}
    return orjson.dumps({"source": "sdk", "batch_id": f"sdk:{k}", "training": [record]})


def _send_until_acked(url: str, posts: list[tuple[bytes, dict[str, str]]], acked: list[int]) -> None:
    """One sender: each body in order, retried (on a fresh connection) until acknowledged; every
    fifth one sent again on a fresh connection too, as a sender that lost the answer would."""
    client = httpx.Client(timeout=10)
    for n, (body, headers) in enumerate(posts):
        tries = 2 if n % 5 == 0 else 1
        while tries:
            try:
                status = client.post(f"{url}/api/v1/ingest", content=body, headers=headers).status_code
            except httpx.HTTPError:
                status = 0
            if status == 200:
                tries -= 1
                if tries:
                    client.close()
                    client = httpx.Client(timeout=10)
                continue
            client.close()
            client = httpx.Client(timeout=10)
            time.sleep(0.05)
        acked[0] += 1
    client.close()


def _stored(path: Path, start: float) -> tuple[Counter[tuple[str, str, float]], int, int]:
    """(rows by node, gpu and time; training records; xid events) the store holds."""
    with DuckDBStore(str(path)) as store:
        rows: Counter[tuple[str, str, float]] = Counter()
        for batch in store.replay(start - 1, start + TICKS + 1):
            for frame in batch.frames:
                for labels in frame.entities:
                    rows[(labels["node"], labels["gpu"], round(frame.ts, 3))] += 1
        training = len(store.training("train", start - 1, start + TICKS + 1))
        xids = len(store.events(start - 1, start + TICKS + 1, kind="xid"))
    return rows, training, xids


def test_two_workers_store_every_acknowledged_batch_once_through_a_killed_worker(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    assert runtime.server is not None and runtime.workers is not None
    start = time.time() - 120
    runtime.start()
    url = runtime.server.url
    try:
        senders = []
        acked = [[0] for _ in range(NODES + 1)]
        for i in range(NODES):
            posts = [(_frame(f"node-{i}", k, start), FRAME) for k in range(TICKS)]
            senders.append(threading.Thread(target=_send_until_acked, args=(url, posts, acked[i])))
        sdk = [(_sdk(k, start), JSON) for k in range(TICKS)]
        senders.append(threading.Thread(target=_send_until_acked, args=(url, sdk, acked[NODES])))
        for thread in senders:
            thread.start()
        wait_until(lambda: sum(a[0] for a in acked) >= TICKS, 60, "a third of the batches acknowledged")
        os.kill(runtime.workers.pids()[0], signal.SIGKILL)  # mid-load: its connections break
        for thread in senders:
            thread.join(timeout=120)
        assert [a[0] for a in acked] == [TICKS] * (NODES + 1)
        counters = runtime.hub.counters
        wait_until(lambda: counters.get("ingest_worker_restarts") == 1, 30, "the killed worker restarted")
        # the hub's own routes, on the same port, from a connection a worker handed over
        health = httpx.get(f"{url}/api/v1/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        wait_until(lambda: any("xid" in a.rule for a in runtime.hub.firing()), 30, "the XID alert")
        assert len([a for a in runtime.hub.firing() if "xid" in a.rule]) == 1
    finally:
        runtime.stop()
    rows, training, xids = _stored(tmp_path / "hub.duckdb", start)
    nodes = [f"node-{i}" for i in range(NODES)]
    expected = {(node, g, round(start + k, 3)) for node in nodes for g in "01" for k in range(TICKS)}
    assert set(rows) == expected and set(rows.values()) == {1}  # every acknowledged row, once
    assert training == TICKS and xids == 1

    # a restart on the same files, workers again: what their logs still hold is not stored twice
    again = _runtime(tmp_path)
    again.start()
    again.stop()
    assert _stored(tmp_path / "hub.duckdb", start) == (rows, training, xids)


def _post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/ingest", content=body, headers=headers, timeout=10)


def test_a_lagging_hub_sheds_at_its_workers_takes_the_urgent_lane_and_raises_one_hub_overloaded(
    tmp_path: Path,
) -> None:
    runtime = _runtime(tmp_path, evaluate=None)  # the test is the clock
    assert runtime.server is not None
    start = time.time() - 60
    runtime.start()
    url, hub = runtime.server.url, runtime.hub
    try:
        assert _post(url, _frame("node-1", 0, start), FRAME).status_code == 200
        named = {**FRAME, SENDER_HEADER: "node=node-1"}

        answers: list[httpx.Response] = []

        def shed() -> bool:
            hub.overload.observe_lag(time.time(), 30.0)  # its detectors 30 s behind, as they stay
            answers.append(_post(url, _frame("node-1", 1, start), named))
            return answers[-1].status_code == 503

        # the refusing answer itself: a second request may reach the other worker, which learns of
        # the lag a quarter second later
        wait_until(shed, 20, "a worker shedding")
        refused = answers[-1]
        assert int(refused.headers["retry-after"]) >= 1
        labels = {"node": "node-1", "gpu": "1"}
        event = {"ts": start + 2, "kind": "xid", "labels": labels, "data": {"code": 79}}
        urgent = orjson.dumps({"source": "node-1", "batch_id": "node-1:2:urgent", "events": [event]})
        assert _post(url, urgent, {**JSON, URGENT_HEADER: URGENT_EVENTS}).status_code == 200
        # the workers' refusals reach the hub: the sender's silence is the hub's doing
        sender = (("node", "node-1"),)
        wait_until(lambda: sender in hub.overload.cover(time.time()).refused, 10, "the refusal reported")
        for _ in range(3):
            hub.evaluate(time.time())
        overloaded = [a for a in hub.firing() if a.rule == HUB_OVERLOADED]
        assert len(overloaded) == 1
        # counted by the workers (each reports every quarter second), in the hub's counters
        shed_count = sum(answer.status_code == 503 for answer in answers)
        wait_until(
            lambda: hub.counters.get("ingest_shed_requests") >= shed_count, 10, "the workers' counters"
        )
    finally:
        runtime.stop()


def test_ingest_workers_setting_is_checked_and_needs_a_file_store(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"hub": {"ingest_workers": -1}}))
    with pytest.raises(ConfigError, match=r"hub\.ingest_workers"):
        load_config(path)
    path.write_text(yaml.safe_dump({"hub": {"ingest_wrokers": 2}}))
    with pytest.raises(ConfigError, match="ingest_wrokers"):
        load_config(path)
    path.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{free_port()}",
                "storage": {"path": ":memory:"},
                "hub": {"ingest_workers": 1},
            }
        )
    )
    with pytest.raises(AssemblyError, match=r"hub\.ingest_workers: needs the DuckDB store on a file"):
        assemble(load_config(path))


def test_what_a_former_worker_acknowledged_is_stored_by_a_hub_without_workers(tmp_path: Path) -> None:
    """``hub.ingest_workers`` lowered to 0 after a crash: the logs of the workers it had are read."""
    start = time.time() - 60
    directory = tmp_path / "hub.duckdb.ingest" / "3"  # a worker the former setting had
    log = IngestLog(directory, Counters(), reserve_bytes=0)
    list(log.recover(0))
    log.start()
    for k in range(5):
        log.append(_frame("node-7", k, start), lambda seq: None)
    state = WorkerState(directory)
    state.synced = log.synced  # as the worker says before it acknowledges
    log.close()
    state.close()
    runtime = _runtime(tmp_path, workers=0)
    runtime.start()
    runtime.stop()
    rows, _, _ = _stored(tmp_path / "hub.duckdb", start)
    assert sorted(rows) == sorted(("node-7", g, round(start + k, 3)) for k in range(5) for g in "01")
    assert set(rows.values()) == {1}
    again = _runtime(tmp_path, workers=0)  # read once: a second start stores nothing again
    again.start()
    again.stop()
    assert _stored(tmp_path / "hub.duckdb", start)[0] == rows


def test_a_workers_report_names_only_the_senders_new_since_the_last_and_it_keeps_no_more() -> None:
    """Every quarter second a worker tells its hub who knocked (the hub's wire keeps them). Jobs come
    and go, 20 new ranks each interval here: a report names that interval's senders, one with no new
    knock names nobody, and the worker's table holds one interval's senders, not all it ever served."""
    worker_end, hub_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    overload = OverloadMonitor(name="worker-0")
    reporter = Reporter(Control(worker_end, Counters()), overload, Counters())

    def reported(now: float) -> set[str]:
        reporter.report(now)
        message = hub_end.recv(MAX_MESSAGE)
        assert message[:1] == REPORT
        doc = orjson.loads(message[1:])
        return {",".join(f"{k}={v}" for k, v in pairs) for pairs, _ in doc["knocks"]}

    try:
        nodes = [f"node={n}" for n in ("a", "b", "c", "d")]
        for k in range(30):
            t = 1000.0 + 0.25 * k
            senders = [*nodes, *(f"job=job-{k},rank={r}" for r in range(20))]
            for sender in senders:
                ticket = overload.admit(t, parse_sender(sender)).ticket
                assert ticket is not None
                overload.done(ticket)
            assert entries(overload) == len(senders)  # this interval's, not 4 + 20 k
            assert reported(t) == set(senders)
        assert reported(t + 0.25) == set()  # told once: nothing new, nothing again
        assert entries(overload) == 0
    finally:
        worker_end.close()
        hub_end.close()


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of a server that is never started (the worker's clock only reads its flag)."""


def test_a_workers_clock_deletes_what_its_hub_holds_and_ends_the_worker_when_the_hub_goes(
    tmp_path: Path,
) -> None:
    """The worker's clock releases its log's segments when the hub's store moved or the open
    segment filled, not every quarter second: what the hub holds still goes (the segment a
    release rotated away included), what it does not hold stays, and the worker ends once its
    hub's control socket closes."""
    directory = tmp_path / "0"
    ingest_log = IngestLog(directory, Counters(), segment_bytes=1, reserve_bytes=0)  # full at once
    for _ in ingest_log.recover(0):
        pass
    ingest_log.start()
    state = WorkerState(directory)
    worker_end, hub_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    overload = OverloadMonitor(name="worker-0")
    reporter = Reporter(Control(worker_end, Counters()), overload, Counters())
    server = uvicorn.Server(uvicorn.Config(_no_app))
    spec = WorkerSpec(0, str(directory), 0, AuthSettings(), Limits(), OverloadSettings(), True, "hub", -1, -1)

    def segments() -> list[int]:  # each segment by its first record
        return sorted(int(p.stem) for p in directory.glob("*.seg"))

    async def until(what: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not what():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        clock = asyncio.create_task(
            worker_clock(server, spec, state, ingest_log, overload, reporter, worker_end)
        )
        ingest_log.append(b"record 1", lambda seq: None)
        state.held = 1  # the hub holds it: its segment goes, a fresh one is opened
        await until(lambda: segments() == [2])
        for k in (2, 3):
            ingest_log.append(b"record %d" % k, lambda seq: None)
        await until(lambda: segments() == [2, 4])  # full: a fresh one, the full one kept
        await asyncio.sleep(0.6)
        assert segments() == [2, 4]  # records 2 and 3 are the worker's alone
        state.held = 3
        await until(lambda: segments() == [4])
        assert (directory / f"{4:020d}.seg").stat().st_size == 0
        assert not clock.done()
        hub_end.close()  # the hub went away
        await asyncio.wait_for(clock, 2)
        assert server.should_exit

    try:
        asyncio.run(scenario())
    finally:
        ingest_log.close()
        state.close()
        worker_end.close()
        hub_end.close()
