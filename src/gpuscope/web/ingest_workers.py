"""The hub's side of its ingest workers (``hub.ingest_workers``; the workers: :mod:`.ingest_worker`).

:class:`IngestWorkers` starts N worker processes on the hub's listening socket, reads each one's
log behind it into the store (:meth:`DuckDBStore.take_logged
<gpuscope.store.duckdb.store.DuckDBStore.take_logged>`, de-duplicated by batch id there) and on
to the detectors, tells the workers how far the store holds their logs and whether the hub
lags, hears their reports (refusals, counters) and the connections they hand over, restarts a
worker that dies (counted: ``ingest_worker_restarts``), and stops them.

Order (the runtime, :mod:`gpuscope.runtime`, calls these in its place): :meth:`replay` once the
store is open and before the detectors warm up (what the workers acknowledged before the last
stop reaches the tables, so the warm-up reads it as it reads the rest); :meth:`start` once the
hub's server runs (the connections handed over are served there) — in ``gpuscope hub``, just
before it serves, the hub adopting what arrives meanwhile once its loop runs; :meth:`stop` first
when the hub stops (no new batch), which then takes in everything the workers acknowledged,
before the evaluator, alerting and the store stop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gpuscope.hub import Hub
from gpuscope.ingest.overload import SenderKey
from gpuscope.ingest.worker_state import WorkerState
from gpuscope.store.duckdb.store import DuckDBStore
from gpuscope.store.log_codec import decode
from gpuscope.store.log_tail import LogTail
from gpuscope.web.ingest_worker import HAND_OVER, MAX_MESSAGE, REPORT, WorkerSpec
from gpuscope.web.server import HubServer

log = logging.getLogger("gpuscope.hub")

#: records taken from one worker's log in a pass of the reader
PASS_RECORDS = 256
#: the reader's pause when a pass found nothing new: a worker syncs its log at most every 50 ms
#: (the log's group-commit window), and a pass costs the hub's interpreter ~0.1 ms, so polling
#: each 5 ms cost a 64-node hub about 0.3 ms of CPU a batch (bench/bench_hub_cpu.py)
IDLE_S = 0.025
#: how long a worker may take to finish its requests and sync its log when told to stop
STOP_S = 15.0
#: a worker that died is started again after this (a worker that cannot start is not respawned
#: in a tight loop)
RESTART_DELAY_S = 0.5


def worker_logs(store_path: str) -> Path:
    """The directory of the workers' logs, one subdirectory each, beside the store."""
    return Path(store_path + ".ingest")


def replay_logs(store: DuckDBStore) -> tuple[int, dict[int, int]]:
    """Every ingest worker's log beside ``store`` (this run's, and those of workers a former
    setting had: ``hub.ingest_workers`` lowered, or 0) into the store past the position the
    store holds of it: (batches moved, the position reached in each log). No worker may be
    writing them."""
    directory = worker_logs(store.path)
    reached: dict[int, int] = {}
    if not directory.is_dir():
        return 0, reached
    replayed = 0
    for sub in sorted(directory.iterdir()):
        if not sub.name.isdigit() or not sub.is_dir():
            continue
        index = int(sub.name)
        state = WorkerState(sub)
        tail = LogTail(sub, store.origin_position(index))
        try:
            while records := tail.read(state.synced, PASS_RECORDS):
                for seq, payload in records:
                    store.take_logged(decode(payload), index, seq)
                replayed += len(records)
        finally:
            tail.close()
            state.close()
        reached[index] = tail.position
    return replayed, reached


@dataclass(slots=True)
class _Worker:
    index: int
    directory: Path
    state: WorkerState
    tail: LogTail
    #: (a synced position the reader saw, when it first saw it), oldest first, while not taken:
    #: the first one's time bounds how long the oldest record not taken has waited
    seen: deque[tuple[int, float]] = field(default_factory=deque)
    proc: subprocess.Popen[bytes] | None = None
    control: socket.socket | None = None
    died_at: float | None = None


def _senders(doc: list[list[Any]]) -> dict[SenderKey, float]:
    return {tuple((str(k), str(v)) for k, v in pairs): float(at) for pairs, at in doc}


class IngestWorkers:
    """``count`` ingest worker processes for ``hub`` (see the module docstring). ``spec`` is what
    every worker is started with (its index, directory, position and descriptors are filled in)."""

    def __init__(self, hub: Hub, store: DuckDBStore, server: HubServer, count: int, spec: WorkerSpec) -> None:
        if count < 1:
            raise ValueError(f"hub.ingest_workers: at least 1 to start workers, got {count}")
        self.hub = hub
        self.store = store
        self.server = server
        self.spec = spec
        self.directory = worker_logs(store.path)
        self.workers: list[_Worker] = []
        for index in range(count):
            directory = self.directory / str(index)
            state = WorkerState(directory)
            self.workers.append(
                _Worker(index, directory, state, LogTail(directory, store.origin_position(index)))
            )
        self._stopping = threading.Event()  # no restarts: the workers are told to stop
        self._stopped = threading.Event()  # the workers exited: the reader ends once caught up
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()  # the selector and the workers' processes
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ reading the logs

    def replay(self) -> int:
        """Move what the workers' logs hold past the store's position into the store (at start,
        before the warm-up reads the store; the detectors see it through the warm-up)."""
        replayed, reached = replay_logs(self.store)
        for worker in self.workers:
            worker.tail.close()
            worker.tail = LogTail(worker.directory, reached.get(worker.index, worker.tail.position))
        self.hub.counters.inc("store.log_replayed_batches", replayed)
        return replayed

    def _take(self, worker: _Worker, observe: bool = True) -> int:
        """One pass over one worker's log: its synced records not taken yet, into the store."""
        synced = worker.state.synced
        if synced > (worker.seen[-1][0] if worker.seen else worker.tail.position):
            worker.seen.append((synced, time.time()))
        records = worker.tail.read(synced, PASS_RECORDS)
        for seq, payload in records:
            try:
                batch = decode(payload)
                result = self.store.take_logged(batch, worker.index, seq)
            except Exception:  # checksummed, so a bug: one record must not stop the others
                self.hub.counters.inc("ingest_worker_unreadable_records")
                log.exception("record %d of ingest worker %d's log could not be stored", seq, worker.index)
                continue
            if observe:
                self.hub.taken(batch, result)
        while worker.seen and worker.seen[0][0] <= worker.tail.position:
            worker.seen.popleft()
        worker.state.held = self.store.origin_position(worker.index)
        return len(records)

    def _read_loop(self) -> None:
        """Take the workers' records as they are synced, and tell them whether the hub lags."""
        while True:
            stopped = self._stopped.is_set()
            moved = sum(self._take(worker) for worker in self.workers)
            now = time.time()
            # how long the oldest record a worker acknowledged and the hub has not taken waited
            waited = max((now - w.seen[0][1] for w in self.workers if w.seen), default=0.0)
            overload = self.hub.overload
            overload.consume_lag(now, waited)
            lagging = overload.lagging(now)
            for worker in self.workers:
                worker.state.hub_lagging = lagging
            if stopped and not moved and not any(w.tail.position < w.state.synced for w in self.workers):
                return  # the workers stopped first: everything they acknowledged is taken
            if not moved:
                time.sleep(IDLE_S)

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        """Start the workers, the reader of their logs and their supervisor."""
        for worker in self.workers:
            self._spawn(worker)
        for name, target in (
            ("gpuscope-ingest-read", self._read_loop),
            ("gpuscope-ingest-workers", self._watch),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _spawn(self, worker: _Worker) -> None:
        hub_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (hub_end, worker_end):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_MESSAGE)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * MAX_MESSAGE)
        spec = replace(
            self.spec,
            index=worker.index,
            log_dir=str(worker.directory),
            held=self.store.origin_position(worker.index),
            listen_fd=self.server.sock.fileno(),
            control_fd=worker_end.fileno(),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscope.web.ingest_worker"],
            stdin=subprocess.PIPE,
            pass_fds=(spec.listen_fd, spec.control_fd),
            start_new_session=True,  # a terminal's Ctrl-C reaches the hub, which stops its workers
        )
        worker_end.close()
        assert proc.stdin is not None
        try:
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.close()
        except OSError:  # it died at once: the supervisor sees it and tries again
            pass
        with self._lock:
            worker.proc, worker.control, worker.died_at = proc, hub_end, None
            self._selector.register(hub_end, selectors.EVENT_READ, worker)

    def _watch(self) -> None:
        """Hear the workers (connections handed over, reports) and restart one that died."""
        while not self._stopping.is_set():
            ready = self._selector.select(timeout=0.05) if self._selector.get_map() else []
            if not ready:
                time.sleep(0.01)
            for key, _ in ready:
                self._hear(key.data)
            self._restart_dead()

    def _hear(self, worker: _Worker) -> None:
        sock = worker.control
        if sock is None:
            return
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, 1)
        except OSError:
            message, fds = b"", []
        if not message:  # the worker's end closed: it exited
            self._forget(worker)
            return
        kind, body = message[:1], message[1:]
        if kind == HAND_OVER and fds:
            self.server.adopt(fds[0], body)
            return
        for fd in fds:
            os.close(fd)
        if kind == REPORT:
            self._report(worker.index, orjson.loads(body))

    def _report(self, index: int, doc: dict[str, Any]) -> None:
        anonymous = doc["anonymous"]
        self.hub.overload.worker_report(
            time.time(),
            index,
            _senders(doc["refused"]),
            -math.inf if anonymous is None else float(anonymous),
            int(doc["shed"]),
            bool(doc["lagging"]),
            _senders(doc.get("knocks", [])),
        )
        for name, n in doc["counters"].items():
            self.hub.counters.inc(str(name), int(n))

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            if worker.control is not None:
                self._selector.unregister(worker.control)
                worker.control.close()
                worker.control = None

    def _restart_dead(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            proc = worker.proc
            if proc is None or proc.poll() is None or self._stopping.is_set():
                continue
            if worker.died_at is None:
                worker.died_at = now
                self.hub.counters.inc("ingest_worker_restarts")
                log.warning("ingest worker %d exited (%s): starting it again", worker.index, proc.returncode)
                continue
            if now - worker.died_at >= RESTART_DELAY_S:
                while worker.control is not None:  # what it said before it died is heard first
                    self._hear(worker)
                self._spawn(worker)

    def pids(self) -> list[int]:
        """The workers' process ids (the benchmarks count their CPU with the hub's)."""
        return [w.proc.pid for w in self.workers if w.proc is not None]

    def stop(self) -> None:
        """Stop the workers (each finishes its requests and syncs its log), then take in every
        batch they acknowledged."""
        self._stopping.set()
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("ingest worker %d did not stop in %.0f s: killed", worker.index, STOP_S)
                worker.proc.kill()
                worker.proc.wait()
        self._stopped.set()
        for thread in self._threads:
            thread.join()
        for worker in self.workers:
            while worker.control is not None:  # its last report
                self._hear(worker)
            if not self._threads:  # never started: what they hold is taken here
                while self._take(worker):
                    pass
            worker.state.held = self.store.origin_position(worker.index)
        self._selector.close()

    def close(self) -> None:
        for worker in self.workers:
            worker.tail.close()
            worker.state.close()
