"""An ingest worker: a process of its own that takes agents' and SDKs' batches for its hub.

A hub's process is held to about one core by the interpreter lock, and most of an agent's request
is work that needs nothing of the hub's state: parsing HTTP, decoding and validating the batch,
writing its record durably, answering. With ``hub.ingest_workers: N`` that work runs in N such
processes (:mod:`gpuscope.web.ingest_workers` starts, watches and stops them); the hub keeps the
store's commit, detection, evaluation, alerting and every other route.

One port. The hub binds the listening socket and each worker inherits it; the hub's own server
accepts nothing on it. A worker serves ``POST /api/v1/ingest`` on the connections it accepts
(the same front door and route steps as the hub's: :class:`~gpuscope.web.ingest_route.IngestRoute`,
:class:`~gpuscope.web.lean_ingest.LeanIngest`, with the same answers) and proxies nothing: a
connection whose next request is anything else, arriving while the connection is idle, is handed
over whole to the hub process (its descriptor and the bytes read, over the worker's control socket),
which serves it from then on. A request other than ingest pipelined behind an unanswered ingest
request on the same connection cannot be handed over; it is answered 503 with ``Retry-After: 1``
and ``Connection: close`` (no client of gpuscope's does that; a retry on a fresh connection is
handed over).

Nothing acknowledged is lost: a batch is answered 200 once its record is synced in the worker's
own ingest log (a directory beside the store, :mod:`gpuscope.store.ingest_log`), which the hub
reads behind it (:mod:`gpuscope.store.log_tail`) and moves into its store, de-duplicating by batch
id there (a retry may reach another worker). The acknowledgement counts what the batch holds:
whether the store refuses part of it for its limits (entities, metrics), or already holds it (a
retry), is known only where it is consumed, and counted there (``store.refused_*``,
``ingest_duplicate_batches`` in the hub's ``/metrics``).

Overload: each worker admits requests with an :class:`~gpuscope.ingest.overload.OverloadMonitor`
of its own (its requests in flight, its event loop's lag, the urgent lane) and also sheds while
the hub shows a sign of lag (the shared :class:`~gpuscope.ingest.worker_state.WorkerState`: its
evaluation or detectors behind, or the workers' acknowledged batches waiting too long to be taken
in). Every quarter second it reports to the hub whom it refused and who knocked since its last
report (and then forgets them: the hub keeps them), how many requests it shed, whether it saw
itself behind and its counters: the hub's verdicts hold those senders' silence, and
``hub_overloaded`` is raised once, by the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import numpy as np
import orjson
import uvicorn
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gpuscope import gcpolicy
from gpuscope.counters import Counters
from gpuscope.ingest.overload import OverloadMonitor, OverloadSettings, SenderKey
from gpuscope.ingest.payload import Limits
from gpuscope.ingest.worker_state import WorkerState
from gpuscope.model import Batch
from gpuscope.store.base import AppendResult, Durable
from gpuscope.store.errors import write_error
from gpuscope.store.ingest_log import IngestLog
from gpuscope.store.log_codec import encode
from gpuscope.web.answer import json_answer
from gpuscope.web.auth import AuditLog, AuthSettings
from gpuscope.web.guard import AuthMiddleware
from gpuscope.web.ingest_route import INGEST_PATH, IngestFirst, IngestRoute
from gpuscope.web.lean_ingest import LeanHttpProtocol, LeanIngest

log = logging.getLogger("gpuscope.ingest_worker")

#: how often a worker reports to its hub, and reads the hub's lag
REPORT_S = 0.25
LOOP_PROBE_S = 0.25
#: the bytes a connection's next request starts with when it is the worker's to serve
_INGEST = f"POST {INGEST_PATH}".encode("ascii")
#: control messages, worker to hub: a connection handed over (with its descriptor), a report
HAND_OVER = b"H"
REPORT = b"R"
#: the largest control message: a report, or a connection's bytes read so far (a read is at most
#: 256 KiB with uvloop)
MAX_MESSAGE = 1 << 20


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker is started with (pickled to its standard input: the tokens stay off its
    command line)."""

    index: int
    log_dir: str
    #: the hub's store holds this worker's log up to here (segments below it may go)
    held: int
    auth: AuthSettings
    limits: Limits
    overload: OverloadSettings
    open_reads: bool
    name: str  # the hub's name in hub_overloaded
    listen_fd: int
    control_fd: int


def accepted(batch: Batch) -> AppendResult:
    """What an acknowledgement counts: the values, events and training records the batch holds."""
    samples = sum(int(np.count_nonzero(~np.isnan(f.values))) for f in batch.frames)
    return AppendResult(samples=samples, events=len(batch.events), training=len(batch.training))


def _nothing(seq: int) -> None:
    pass


class WorkerIntake:
    """The ingest route's target in a worker: its own log, synced before any acknowledgement."""

    def __init__(
        self, log: IngestLog, state: WorkerState, counters: Counters, overload: OverloadMonitor
    ) -> None:
        self.log = log
        self.state = state
        self.counters = counters
        self.overload = overload
        self._lock = threading.Lock()

    def ingest(self, batch: Batch) -> AppendResult:
        result = accepted(batch)
        try:
            self.log.append(encode(batch), _nothing)
        except OSError as exc:
            raise write_error("append failed", exc) from None
        self._publish()
        return result

    def ingest_then(self, batch: Batch, durable: Durable) -> bool:
        result = accepted(batch)  # before the record is made: an agent's frame is handed over to it
        try:
            seq = self.log.write(encode(batch), _nothing)
        except OSError as exc:
            raise write_error("append failed", exc) from None

        def synced(error: OSError | None) -> None:
            if error is not None:
                durable(write_error("append failed", error))
                return
            self._publish()
            durable(result)

        self.log.when_synced(seq, synced)
        return True

    def _publish(self) -> None:
        """Tell the hub how far the log is synced (from the thread whose sync covered a record)."""
        with self._lock:
            synced = self.log.synced
            if synced > self.state.synced:
                self.state.synced = synced

    def owner_url(self, batch: Batch) -> str | None:
        return None  # a cluster member's hub answers with the owner; its workers are not used there


class Control:
    """The worker's end of its control socket (a ``SOCK_SEQPACKET`` pair with the hub)."""

    def __init__(self, sock: socket.socket, counters: Counters) -> None:
        self.sock = sock
        self.counters = counters
        self._lock = threading.Lock()

    def hand_over(self, fd: int, data: bytes) -> bool:
        """Send a connection (its descriptor and the bytes read) to the hub; False if it failed."""
        try:
            with self._lock:
                socket.send_fds(self.sock, [HAND_OVER + data], [fd])
        except OSError as exc:
            self.counters.inc("ingest_worker_hand_over_failures")
            log.warning("could not hand a connection over to the hub: %s", exc)
            return False
        self.counters.inc("ingest_worker_handed_over")
        return True

    def report(self, doc: dict[str, Any]) -> None:
        with self._lock:
            self.sock.send(REPORT + orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS))


def is_ingest_start(data: bytes) -> bool:
    """Whether bytes that start a request may be ``POST /api/v1/ingest`` (all of them that came)."""
    n = min(len(data), len(_INGEST))
    return data[:n] == _INGEST[:n]


class WorkerHttpProtocol(LeanHttpProtocol):
    """:class:`LeanHttpProtocol` that hands a connection over to the hub when its next request,
    arriving while the connection is idle, is not an ingest request (see the module docstring)."""

    control: ClassVar[Control]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.in_message = False

    def on_message_begin(self) -> None:
        self.in_message = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self.in_message = False
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        idle = not self.in_message and not self.pipeline and (cycle is None or cycle.response_complete)
        if idle and not is_ingest_start(data):
            sock = self.transport.get_extra_info("socket")
            if sock is not None and self.control.hand_over(sock.fileno(), data):
                self.transport.close()  # the hub holds the connection now: this closes our copy
                return
        super().data_received(data)


def worker_protocol(ingest: LeanIngest, control: Control) -> type[WorkerHttpProtocol]:
    return type("IngestWorkerProtocol", (WorkerHttpProtocol,), {"ingest": ingest, "control": control})


async def _elsewhere(scope: Scope, receive: Receive, send: Send) -> None:
    """A request other than ingest that could not be handed over (pipelined behind one)."""
    if scope["type"] != "http":
        return
    doc = {
        "error": "send this request on a connection of its own: this one is an ingest worker's",
        "field": "path",
    }
    await json_answer(503, doc, [(b"retry-after", b"1"), (b"connection", b"close")]).send(send)


def _sender_doc(refused: dict[SenderKey, float]) -> list[list[Any]]:
    return [[[list(pair) for pair in sender], at] for sender, at in refused.items()]


class Reporter:
    """What the worker tells its hub every :data:`REPORT_S` (see the module docstring)."""

    def __init__(self, control: Control, overload: OverloadMonitor, counters: Counters) -> None:
        self.control = control
        self.overload = overload
        self.counters = counters
        self._shed = 0
        self._counted: dict[str, int] = {}

    def report(self, now: float) -> None:
        refused, anonymous = self.overload.take_refusals()
        knocks = self.overload.take_knocks()
        shed, self._shed = self.overload.shed - self._shed, self.overload.shed
        counts = self.counters.snapshot()
        delta = {k: v - self._counted.get(k, 0) for k, v in counts.items() if v != self._counted.get(k, 0)}
        self._counted = counts
        self.control.report(
            {
                "refused": _sender_doc(refused),
                "knocks": _sender_doc(knocks),
                "anonymous": anonymous if math.isfinite(anonymous) else None,
                "shed": shed,
                "lagging": self.overload.lagging(now),
                "counters": delta,
            }
        )


async def worker_clock(
    server: uvicorn.Server,
    spec: WorkerSpec,
    state: WorkerState,
    log: IngestLog,
    overload: OverloadMonitor,
    reporter: Reporter,
    control: socket.socket,
) -> None:
    """The worker's clock: the hub's lag in, the reports out, released segments deleted, and
    the end of the hub (its control socket closed) noticed.

    A plain sleep paces it (the control socket's reader ends the server itself), and the log is
    released only when the hub's store moved (at its commits, every few seconds), when the open
    segment is full, or after a release that asked for a fresh segment (the one it left goes
    next). A wait on an event with a timeout made a task and a timer eight times a second, and a
    release lists the log's directory on an executor thread, four times a second: an idle worker
    spent 2.0–2.3 ms of CPU a second, 1.7 with this clock and the collector tuned."""
    loop = asyncio.get_running_loop()
    fd = control.fileno()

    def gone() -> None:  # the hub never writes: readable means closed
        loop.remove_reader(fd)
        server.should_exit = True

    loop.add_reader(fd, gone)
    lagged = spec.overload.max_lag_s + 1.0
    last_report = 0.0
    released = -1
    again = False  # the last release asked for a fresh segment: the one it left goes next time
    try:
        while not server.should_exit:
            started = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S / 2)
            if server.should_exit:
                break
            now = time.time()
            late = max(0.0, time.monotonic() - started - LOOP_PROBE_S / 2)
            overload.loop_lag(now, late, next_due=now + LOOP_PROBE_S / 2)
            overload.observe_lag(now, lagged if state.hub_lagging else 0.0)
            if now - last_report >= REPORT_S:
                last_report = now
                try:
                    reporter.report(now)
                except OSError:
                    server.should_exit = True
                    break
                held = state.held
                if held and (held != released or again or log.segment_full()):
                    released = held
                    again = await loop.run_in_executor(None, log.release, held)
    finally:
        loop.remove_reader(fd)


async def _serve(server: uvicorn.Server, listen: socket.socket, tend: Callable[[], Any]) -> None:
    task = asyncio.create_task(tend())
    try:
        await server.serve(sockets=[listen])
    finally:
        server.should_exit = True
        await task


def run(spec: WorkerSpec) -> None:
    """Serve until told to stop (SIGTERM/SIGINT) or until the hub goes away."""
    counters = Counters()
    overload = OverloadMonitor(spec.overload, name=spec.name)
    directory = Path(spec.log_dir)
    ingest_log = IngestLog(directory, counters)
    for _ in ingest_log.recover(spec.held):
        pass  # the hub reads them; recovery only cuts a torn record off and finds the last one
    ingest_log.start()
    state = WorkerState(directory)
    state.synced = ingest_log.synced
    intake = WorkerIntake(ingest_log, state, counters, overload)
    route = IngestRoute(intake, spec.limits)
    guard = AuthMiddleware(
        route,
        settings=spec.auth,
        routes=lambda: [Route(INGEST_PATH, route, methods=["POST"])],
        open_reads=spec.open_reads,
        counters=counters,
        audit=AuditLog(),
    )
    control_sock = socket.socket(fileno=spec.control_fd)
    control = Control(control_sock, counters)
    listen = socket.socket(fileno=spec.listen_fd)
    config = uvicorn.Config(
        IngestFirst(_elsewhere, guard),
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="off",
        http=worker_protocol(LeanIngest(route, guard), control),
        loop="uvloop",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    reporter = Reporter(control, overload, counters)
    tend = functools.partial(worker_clock, server, spec, state, ingest_log, overload, reporter, control_sock)
    # as the hub does once started: start-up's objects are not scanned again and young
    # collections are rarer (with CPython's defaults collections took about 4 % of a worker's
    # event loop at 256 agents a second)
    gcpolicy.tune_for_serving()
    try:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # as Server.run
            runner.run(_serve(server, listen, tend))
    finally:
        ingest_log.close()  # what was written is synced (nothing written is left unacknowledged)
        state.synced = max(state.synced, ingest_log.synced)
        with contextlib.suppress(OSError):
            reporter.report(time.time())
        state.close()


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = pickle.load(sys.stdin.buffer)  # from the hub that started us: trusted
    # uvicorn raises the SIGTERM it stopped on again once it has: this handler lets the log close
    # (a last sync) and the last report go before the process ends
    signal.signal(signal.SIGTERM, _terminated)
    run(spec)


if __name__ == "__main__":
    main()
