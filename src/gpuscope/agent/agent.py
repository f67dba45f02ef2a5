"""The per-node agent: every interval, one round from every collector, sent as one batch.

Rounds are aligned to multiples of the interval on the agent's clock (so samples of all nodes
line up and timestamps compress well) and never drift: a late round does not push the next
one back, and rounds that could not run at all are counted as ``rounds_missed``.

Each round is *sent* later than it is collected, at its tick plus an offset of the node's own
within ``[0, send_spread)`` (a hash of the node's name: stable across restarts, spread across the
fleet). Nodes synchronised by NTP collect on the same instant; posting then too, a fleet of 1,024
would reach the hub within a few tens of milliseconds every second, past the hub's
``overload.max_in_flight``, and be shed as one. The hub's ``Retry-After`` cannot part them either:
it is whole seconds, and a sender only posts in its own slot, so an agent shed in its slot retries
in that slot of a later round. News found while a spool is pending (an XID) is not held back.
``send_spread=0`` sends at the tick, as every agent did before. A simulated
node is simply another :class:`~gpuscope.collect.base.Collector`, so the demo feeds simulated
data through this same agent, sender and spool.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np

from gpuscope import __version__
from gpuscope.agent.sender import Backoff, Sender, TokenRefused
from gpuscope.agent.spool import Spool
from gpuscope.collect.base import Collector, CollectorError, CollectorSet
from gpuscope.counters import Counters
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.overload import urgent_part
from gpuscope.ingest.payload import training_to_json
from gpuscope.model import Batch, Event, Labels

log = logging.getLogger("gpuscope.agent")

#: Counters that :meth:`Agent.stats` always reports, zero or not.
STAT_KEYS = (
    "rounds",
    "rounds_missed",
    "samples_collected",
    "samples_sent",
    "batches_sent",
    "batches_spooled",
    "batches_replayed",
    "batches_refused",
    "spool_dropped_batches",
    "spool_dropped_bytes",
    "send_failures",
    "collector_errors",
)

#: Standard label keys in the order a person reads them (DESIGN §2).
LABEL_ORDER = ("cluster", "node", "gpu", "uuid", "job", "rank", "service", "model", "version")


def default_node_name() -> str:
    """The host's short name, which is what operators call a node."""
    return socket.gethostname().split(".")[0] or "localhost"


#: the urgent spool's directory, inside the agent's spool directory
URGENT_SPOOL = "urgent"
URGENT_SPOOL_MIN_BYTES = 1 << 20


#: the part of the interval after a round's tick by which its sends and its spool's drain end, so
#: that the next round is collected on time
SEND_WINDOW = 0.8


def send_offset(node: str, spread: float) -> float:
    """The node's send offset in ``[0, spread)``: a hash of its name, so the same on every start and
    on every machine (Python's ``hash`` of a string is neither), and even across a fleet."""
    digest = hashlib.blake2b(node.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 * spread


def default_spool_dir(node: str) -> Path:
    """``$XDG_STATE_HOME/gpuscope/spool/<node>`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "gpuscope" / "spool" / node


class Agent:
    """Collects from ``collectors`` every ``interval`` seconds and delivers batches to the hub.

    A hub that refuses the agent's token (401, 403) ends :meth:`run` with
    :class:`~gpuscope.agent.sender.TokenRefused`: an agent that cannot deliver anything must not
    look healthy. The refused batch stays in the spool for the next start.

    ``send_spread``: each round is sent at its tick plus :func:`send_offset` of the node within
    ``[0, send_spread)`` (default: half the interval; 0: at the tick). It must stay below
    :data:`SEND_WINDOW` of the interval, where the round's sends end.
    """

    def __init__(
        self,
        hub_url: str,
        node: str,
        collectors: Sequence[Collector],
        interval: float = 1.0,
        token: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        *,
        sleep: Callable[[float], None] | None = None,
        spool_max_bytes: int = 256 * 1024 * 1024,
        send_timeout: float = 5.0,
        backoff: Backoff | None = None,
        counters: Counters | None = None,
        fsync: bool = True,
        ca_file: str | None = None,
        send_spread: float | None = None,
    ) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        spread = interval / 2 if send_spread is None else send_spread
        if not (0 <= spread < SEND_WINDOW * interval):
            raise ValueError(
                f"--send-spread must be from 0 to below {SEND_WINDOW:g} x --interval "
                f"({SEND_WINDOW * interval:g} s), got {spread!r}"
            )
        if not node:
            raise ValueError("node name must not be empty")
        self.node = node
        self.interval = interval
        #: seconds after each tick at which this node sends its round
        self.send_offset = send_offset(node, spread)
        self.clock = clock
        self._sleep = sleep
        self.counters = counters if counters is not None else Counters()
        self.collectors = CollectorSet(collectors, self.counters)
        self.spool = Spool(
            spool_dir if spool_dir is not None else default_spool_dir(node),
            max_bytes=spool_max_bytes,
            counters=self.counters,
            fsync=fsync,
        )
        try:
            # news written ahead apart, so that it can be sent ahead of the frames spooled before it
            self.urgent_spool = Spool(
                self.spool.dir / URGENT_SPOOL,
                max_bytes=max(spool_max_bytes // 16, URGENT_SPOOL_MIN_BYTES),
                counters=self.counters,
                fsync=fsync,
            )
        except Exception:
            self.spool.close()
            raise
        try:
            self.sender = Sender(
                hub_url,
                spool=self.spool,
                urgent_spool=self.urgent_spool,
                token=token,
                transport=transport,
                timeout=send_timeout,
                counters=self.counters,
                clock=clock,
                backoff=backoff,
                ca_file=ca_file,
                sender={"node": node},
                stop_on_refused_token=True,
            )
        except Exception:
            self.urgent_spool.close()
            self.spool.close()
            raise
        # a fresh id per start: sequence numbers restart at 0, ids stay unique for the hub's dedup
        self.boot_id = f"{int(clock()):x}{secrets.token_hex(3)}"
        self._seq = 0
        self._closed = False
        self._logged_round_errors: set[type[BaseException]] = set()
        self._pending_events = [
            Event(
                ts=clock(),
                kind="agent_started",
                labels={"node": node},
                data={
                    "version": __version__,
                    "collectors": self.collectors.names,
                    "interval": interval,
                    "boot_id": self.boot_id,
                },
            )
        ]

    def run_once(self, now: float | None = None) -> Batch:
        """One round from every collector, as one batch (not sent)."""
        ts = self.clock() if now is None else now
        got = self.collectors.collect(ts)
        events, self._pending_events = self._pending_events + got.events, []
        batch = Batch(
            source=self.node,
            frames=got.frames,
            events=events,
            training=got.training,
            batch_id=f"{self.node}:{self.boot_id}:{self._seq}",
        )
        self._seq += 1
        self.counters.inc("rounds")
        self.counters.inc("samples_collected", batch.sample_count)
        return batch

    def step(self, now: float | None = None, deadline: float | None = None) -> Batch:
        """Collect one round and deliver it (or spool it); spooled batches drain until ``deadline``."""
        batch = self.run_once(now)
        urgent, body = self._encode(batch)
        if urgent is not None:
            self.sender.submit_urgent(urgent, deadline=deadline)
        if body is not None:
            self.sender.submit(body, batch.sample_count, deadline=deadline)
        return batch

    def _encode(self, batch: Batch) -> tuple[bytes | None, bytes | None]:
        """The round's news to send ahead (None: none, or nothing is pending) and the rest."""
        # behind a spool (the hub away or shedding load), news goes ahead of it: an XID must not
        # wait minutes behind the frames queued before it
        news, rest = urgent_part(batch) if self.sender.backlog or not self.sender.hub_ok else (None, batch)
        try:
            urgent = None if news is None else encode_frame(news)
            body = None if rest is None else encode_frame(rest)
        except (TypeError, ValueError) as exc:  # event data JSON cannot hold, a string too long
            self.counters.inc("batches_unencodable")
            log.error("batch %s cannot be encoded (%s); dropped", batch.batch_id, exc)
            return None, None
        return urgent, body

    def _round(self, stop: threading.Event, tick: float) -> None:
        """The round due at ``tick``: collected and stamped at the tick, sent at the node's offset
        after it (news ahead of a spool at once), its spool drained until the send window ends.

        The window ends :data:`SEND_WINDOW` of the interval after the tick whatever the offset: the
        same thread collects the next round at the next tick, on time only if the drain has ended
        (an offset moves the drain's start, not its end, and stays below it)."""
        deadline = tick + SEND_WINDOW * self.interval
        batch = self.run_once(tick)
        urgent, body = self._encode(batch)
        if urgent is not None:
            self.sender.submit_urgent(urgent, deadline=deadline)
        send_at = tick + self.send_offset
        while not stop.is_set():  # stopping: sent at once, the last round
            now = self.clock()
            if not (now < send_at <= now + self.interval):  # due, or the clock stepped back
                break
            self._wait(stop, send_at - now)
        if body is not None:
            self.sender.submit(body, batch.sample_count, deadline=deadline)

    def run(self, stop: threading.Event) -> None:
        """Run rounds at multiples of the interval until ``stop`` is set, each sent at the node's
        offset after its tick."""
        tick = self._next_tick(self.clock())
        while not stop.is_set():
            now = self.clock()
            if tick - now > self.interval:  # the clock stepped back: realign rather than stall
                self.counters.inc("clock_jumps")
                tick = self._next_tick(now)
            if now < tick:
                self._wait(stop, tick - now)
                continue
            late = math.floor((now - tick) / self.interval)
            if late > 0:
                self.counters.inc("rounds_missed", late)
                tick += late * self.interval
            try:
                self._round(stop, tick)
            except TokenRefused:
                raise  # no round can succeed: the caller says so and stops
            except Exception as exc:  # a bug in one round must not end monitoring of the node
                self.counters.inc("round_errors")
                if type(exc) not in self._logged_round_errors:
                    self._logged_round_errors.add(type(exc))
                    log.exception("round at %.3f failed; the agent goes on (counted as round_errors)", tick)
            tick += self.interval

    def stats(self) -> dict[str, int]:
        """Counters (see ``STAT_KEYS``, plus per-kind details) and the spool's backlog."""
        out = dict.fromkeys(STAT_KEYS, 0)
        out.update(self.counters.snapshot())
        out["spool_pending_batches"] = len(self.spool)
        out["spool_pending_bytes"] = self.spool.pending_bytes
        out["spool_disk_bytes"] = self.spool.disk_bytes
        out["hub_ok"] = int(self.sender.hub_ok)
        return out

    def leave(self, reason: str = "shutdown", wait: float = 2.0) -> None:
        """Tell the hub this node is leaving on purpose (a clean stop, a rolling upgrade), so its
        silence from now on is not an outage; waits at most ``wait`` seconds for the hub."""
        now = self.clock()
        event = Event(ts=now, kind="agent_stopping", labels={"node": self.node}, data={"reason": reason})
        batch = Batch(source=self.node, events=[event], batch_id=f"{self.node}:{self.boot_id}:{self._seq}")
        self._seq += 1
        try:
            self.sender.submit(encode_frame(batch), 0, deadline=now + wait)
        except TokenRefused as exc:  # it could not report anything either: nothing to take back
            log.info("could not tell the hub this node is leaving: %s", exc)

    def close(self) -> None:
        """Close collectors, the HTTP client and the spool (what is spooled stays for next start)."""
        if self._closed:
            return
        self._closed = True
        self.collectors.close()
        self.sender.close()
        self.urgent_spool.close()
        self.spool.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_tick(self, now: float) -> float:
        return (math.floor(now / self.interval) + 1) * self.interval

    def _wait(self, stop: threading.Event, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            stop.wait(seconds)


def run_until_signalled(agent: Agent) -> dict[str, int]:
    """Run an agent in this (main) thread until SIGINT or SIGTERM; close it; return its stats."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping the agent", signum)
        stop.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        agent.run(stop)
        agent.leave("stopped by a signal")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        agent.close()
    return agent.stats()


def render_labels(labels: Labels) -> str:
    """``node=node-0,gpu=3``: standard keys first in their usual order, then the rest sorted."""
    keys = [k for k in LABEL_ORDER if k in labels] + sorted(k for k in labels if k not in LABEL_ORDER)
    return ",".join(f"{k}={labels[k]}" for k in keys)


def collect_once_json(
    collectors: Sequence[Collector],
    *,
    rate_window: float = 0.5,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """One round from every collector as JSON a person can read (``gpuscope agent --once --json``).

    Rates need two readings, so a priming round runs ``rate_window`` seconds before the reported
    one (0 skips it; rates are then absent). Events of both rounds are included.
    """
    counters = Counters()
    cs = CollectorSet(collectors, counters)
    events: list[Event] = []
    errors: list[CollectorError] = []
    if rate_window > 0:
        first = cs.collect(clock())
        events.extend(first.events)
        errors.extend(first.errors)
        sleep(rate_window)
    ts = clock()
    got = cs.collect(ts)
    events.extend(got.events)
    errors.extend(got.errors)
    entities: dict[str, dict[str, float]] = {}
    for frame in got.frames:
        for i, labels in enumerate(frame.entities):
            row = entities.setdefault(render_labels(labels), {})
            for j, metric in enumerate(frame.metrics):
                value = float(frame.values[i, j])
                if not np.isnan(value):
                    row[metric] = value
    return {
        "ts": ts,
        "sources": cs.names,
        "samples": got.sample_count,
        "entities": entities,
        "events": [{"ts": e.ts, "kind": e.kind, "labels": e.labels, "data": e.data} for e in events],
        "training": [training_to_json(t) for t in got.training],
        "errors": [{"collector": e.collector, "kind": e.kind, "message": e.message} for e in errors],
    }
