"""The SDK's background thread: merges step reports, beats the heartbeat, and delivers batches.

The training thread only appends to bounded deques (:class:`Queues`); everything that costs
(merging, encoding, HTTP, the disk spool while the hub is away) happens here, through the agent's
:class:`~gpuscope.agent.sender.Sender` and :class:`~gpuscope.agent.spool.Spool`, so the SDK
retries, spools and replays exactly like an agent. Reports of one step from several places (the
user's ``log``, step timing, collectives, memory) are merged into one training record per step,
once that step has been quiet for ``settle`` seconds and a later step has begun (the loop has moved
on, so nothing more is coming for it), or quiet for ``settle_max`` seconds (the last step before a
pause or a hang). Waiting only for quiet split a step in two when the training thread was
descheduled between its step timing and its ``log`` call.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuscope.agent.sender import Sender
from gpuscope.counters import Counters
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.payload import NAME_RE
from gpuscope.model import Batch, Event, TrainingRecord
from gpuscope.sdk.env import Placement
from gpuscope.sdk.goodput import Goodput

log = logging.getLogger("gpuscope.sdk")

Entry = tuple[float, int, dict[str, Any]]  # (wall time, step, metrics)


@dataclass(slots=True)
class Queues:
    """What the training thread hands over; deque appends and pops are atomic under the GIL."""

    capacity: int
    records: deque[Entry] = field(default_factory=deque)
    events: deque[Event] = field(default_factory=deque)
    dropped_records: int = 0  # written only by producers of records (the training thread, mostly)
    dropped_events: int = 0

    def put(self, entry: Entry) -> None:
        """Queue a step report from any thread; counted, never blocking, when full."""
        if len(self.records) < self.capacity:
            self.records.append(entry)
        else:
            self.dropped_records += 1

    def event(self, event: Event) -> None:
        if len(self.events) < self.capacity:
            self.events.append(event)
        else:
            self.dropped_events += 1


def clean_metrics(metrics: dict[str, Any], counters: Counters) -> dict[str, float]:
    """The metrics the hub will accept, as floats; the rest are counted (``sdk_invalid_metrics``).

    Dropped one by one here because the hub refuses a whole batch for one bad name or value,
    which would lose every other record in it.
    """
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                raise ValueError(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                value = float(value)  # tensors and numpy scalars
            out[name] = float(value)
        except (TypeError, ValueError, OverflowError):
            counters.inc("sdk_invalid_metrics")
    return out


@dataclass(slots=True)
class _Pending:
    ts: float
    metrics: dict[str, float]
    touched: float  # monotonic time of the latest report


class Shipper(threading.Thread):
    """Heartbeats every ``heartbeat_interval`` and ships queued reports every ``flush_interval``."""

    def __init__(
        self,
        placement: Placement,
        queues: Queues,
        sender: Sender,
        goodput: Goodput,
        *,
        heartbeat_data: Callable[[], dict[str, Any]],
        samplers: list[tuple[float, Callable[[], dict[str, float]]]] | None = None,
        current_step: Callable[[], int],
        counters: Counters,
        flush_interval: float = 0.25,
        heartbeat_interval: float = 1.0,
        settle: float = 0.3,
        settle_max: float = 2.0,
        goodput_interval: float = 10.0,
        max_batch: int = 5000,
    ) -> None:
        super().__init__(name=f"gpuscope-sdk-{placement.job}-{placement.rank}", daemon=True)
        self.placement = placement
        self.queues = queues
        self.sender = sender
        self.goodput = goodput
        self.heartbeat_data = heartbeat_data
        self.samplers = [(interval, fn, [0.0]) for interval, fn in samplers or []]
        self.current_step = current_step
        self.counters = counters
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.settle = settle
        self.settle_max = max(settle, settle_max)
        self._newest_step = -1  # the highest step any report named
        self.goodput_interval = goodput_interval
        self.max_batch = max_batch
        self.source = f"sdk:{placement.job}:{placement.rank}"
        self._ids = itertools.count()
        self._id_prefix = f"{self.source}:{os.getpid()}:{int(time.time() * 1000)}"
        self._pending: dict[int, _Pending] = {}
        self._halt = threading.Event()
        self._labels = {k: v for k, v in placement.labels.items() if k in ("node", "gpu")}
        self._next_beat = 0.0
        self._next_goodput = time.monotonic() + goodput_interval
        self._invalid_logged = False

    # -- thread --------------------------------------------------------------------------------

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick(time.monotonic())
            except Exception:  # the training job must never die of its monitoring
                self.counters.inc("sdk_internal_errors")
                log.exception("gpuscope: SDK background thread error (counted; continuing)")
            self._halt.wait(self.flush_interval)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread, then ship everything still queued (up to ``timeout`` seconds)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        deadline = time.monotonic() + timeout
        self.tick(time.monotonic(), final=True, deadline=deadline)
        self.sender.flush(deadline=deadline)
        self.goodput.save()

    # -- one round -----------------------------------------------------------------------------

    def tick(self, now: float, final: bool = False, deadline: float | None = None) -> None:
        if now >= self._next_beat and not final:
            self._next_beat = now + self.heartbeat_interval
            self.heartbeat()
        for interval, sample, due in self.samplers:
            if now >= due[0] and not final:
                due[0] = now + interval
                self.queues.put((time.time(), self.current_step(), sample()))
        self._drain(now)
        training = self._ready(now, final)
        if training and (final or now >= self._next_goodput):
            self._next_goodput = now + self.goodput_interval
            self.goodput.save()
            training[-1].metrics.update(self.goodput.report(time.time()).metrics())
        events = self._take_events()
        while training or events:
            chunk_t, training = training[: self.max_batch], training[self.max_batch :]
            chunk_e, events = events[: self.max_batch], events[self.max_batch :]
            self._send(Batch(self.source, events=chunk_e, training=chunk_t), deadline)
        if len(self.sender.spool):
            self.sender.flush(deadline)

    def heartbeat(self) -> None:
        data = {"step": self.current_step(), **self.heartbeat_data()}
        self.queues.event(Event(time.time(), "heartbeat", self.placement.labels, data))

    def _drain(self, now: float) -> None:
        records, pending = self.queues.records, self._pending
        while records:
            ts, step, metrics = records.popleft()
            self._newest_step = max(self._newest_step, step)
            clean = self._clean(metrics)
            slot = pending.get(step)
            if slot is None:
                pending[step] = _Pending(ts, clean, now)
            else:
                slot.metrics.update(clean)
                slot.ts = max(slot.ts, ts)
                slot.touched = now

    def _clean(self, metrics: dict[str, Any]) -> dict[str, float]:
        out = clean_metrics(metrics, self.counters)
        if len(out) < len(metrics) and not self._invalid_logged:
            self._invalid_logged = True
            bad = {k: v for k, v in metrics.items() if k not in out}
            log.error("gpuscope: metrics %r are not snake_case names with numbers; dropped (counted)", bad)
        return out

    def _ready(self, now: float, final: bool) -> list[TrainingRecord]:
        def done(step: int, quiet: float) -> bool:
            if final or quiet >= self.settle_max:
                return True
            return quiet >= self.settle and step < self._newest_step

        ready = [s for s, p in self._pending.items() if done(s, now - p.touched)]
        out = []
        for step in ready:
            slot = self._pending.pop(step)
            self.goodput.step(step, slot.metrics)
            out.append(
                TrainingRecord(
                    slot.ts, self.placement.job, self.placement.rank, step, slot.metrics, self._labels
                )
            )
        return out

    def _take_events(self) -> list[Event]:
        events, out = self.queues.events, []
        while events:
            out.append(events.popleft())
        return out

    def _send(self, batch: Batch, deadline: float | None) -> None:
        batch.batch_id = f"{self._id_prefix}:{next(self._ids)}"
        self.counters.inc("records_shipped", len(batch.training))
        self.counters.inc("events_shipped", len(batch.events))
        self.sender.submit(encode_frame(batch), deadline=deadline)
