"""How long the hub makes its senders' news wait: the one measure of the hub's delay.

A sender's silence is the hub's doing for as long as the hub kept its news waiting. Four readings
show that wait, each from a different place on the way in:

- ``loop``: how late the HTTP event loop ran a timer (requests wait for the loop before they
  can be admitted), and how long a timer is overdue now (a blocked loop is seen while blocked);
- ``waiting``: how long the oldest admitted request has waited;
- ``evaluation``: how late the evaluation ran (nothing is stamped heard in between);
- ``arrival``: how late the senders' news reached the detectors, from their own timestamps:
  requests that queued before admission (a sender's connection pool, the kernel's accept
  queue) are invisible to the other three.

:meth:`HubDelay.delay` is the longest reading still in force. A reading of ``d`` seconds seen at
``t`` holds until ``t + settle + d + interval``: once the hub has caught up, what it kept waiting
``d`` seconds comes in within ``d``, each sender's next report one reporting ``interval`` later,
and a sender it refused is back within ``settle`` (a late evaluation holds ``settle + interval``
only: it sees at once all that waited for it). Held only for ``settle``, a hub at 384 nodes
that had measured its senders 49 s late blamed those still queued 84 s after their last report.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import Any

#: how fast a sender's usual offset (its clock's skew plus transit) may rise, seconds per second:
#: enough to follow a drifting clock, far too slow to absorb a backlog
OFFSET_DRIFT = 0.001
#: the share of the senders heard whose delay the hub takes for its own: most of them, as the
#: queue's unlucky turns are its doing too, short of the few that may be late on their own side
ARRIVAL_QUANTILE = 0.9
#: readings in force kept at most (none outlasted by a larger one is kept; past this, merged)
MAX_HELD = 64


def _quantile(values: list[float]) -> float:
    ranked = sorted(values)
    return ranked[max(0, math.ceil(ARRIVAL_QUANTILE * len(ranked)) - 1)]  # nearest rank


class HubDelay:
    """The hub's delay from its four readings (see the module docstring). Thread-safe: the event
    loop, the ingest workers and the evaluator feed it; the evaluator and the health read it.

    ``settle``: how long after the hub's last refusal its senders are back; ``interval``: the
    senders' reporting interval; ``arrival_floor``: a lateness of most senders' news that counts
    as the hub's delay even while nothing else says the hub is behind (below it, the hub's own
    tick and the senders' jitter); ``forget_s``: how long a sender not heard is remembered."""

    def __init__(
        self, settle: float, *, interval: float = 1.0, arrival_floor: float = 2.0, forget_s: float = 600.0
    ) -> None:
        self.settle = settle
        self.interval = interval
        self.arrival_floor = arrival_floor
        self.forget_s = forget_s
        self._lock = threading.Lock()
        self._held: list[tuple[float, float]] = []  # (reading, in force until)
        #: sender -> (usual offset, last heard at, usual time between hearings)
        self._offsets: dict[str, tuple[float, float, float]] = {}
        self.loop_lag = 0.0
        self._loop_due = math.inf  # when the event loop's next timer is due (inf: none watched)
        self.loop_probes = 0  # event-loop timers measured
        self.evaluation_lag = 0.0
        self.arrival_lag = 0.0

    def loop(self, now: float, lag: float, next_due: float = math.inf) -> None:
        """The event loop ran a timer ``lag`` seconds late at ``now``; its next is due at ``next_due``."""
        with self._lock:
            self._loop_due = next_due
            self.loop_lag = lag
            self.loop_probes += 1
            self._note(now, lag)

    def evaluation(self, now: float, lag: float) -> None:
        """The evaluation due ``lag`` seconds before ``now`` ran now. Not in force for its own length
        after: requests were taken meanwhile, and this evaluation sees every one acknowledged (a
        node that died during a stall is judged once it ends, not a stall's length later)."""
        with self._lock:
            self.evaluation_lag = lag
            self._note(now, lag, own=False)

    def waiting(self, now: float, oldest: float) -> None:
        """The oldest request admitted and not yet answered has waited ``oldest`` seconds at ``now``."""
        with self._lock:
            self._note(now, oldest)

    def arrived(self, now: float, stamps: Iterable[tuple[str, float]], since_lag: float) -> None:
        """The detectors saw at ``now`` the batches of these senders: each (sender, the latest of
        its own timestamps in a batch); ``since_lag``: seconds since the hub last saw itself behind.

        A sender's news is late by how much later than its usual offset from the hub's clock (skew
        plus transit, learned) its freshest timestamp arrives, and by how much longer than usual
        it went unheard (its queue's turn came late). The 90th percentile over the senders heard
        (not the largest: one sender flushing its spool after its own outage is late on its own
        side) is the hub's delay while it is behind and while its senders' queues drain after. The
        offsets' alone is also while it passes ``arrival_floor`` (most senders' news queued on its
        way in, wherever that was, before the hub saw itself behind: a client's connection pool at
        the start of a run), but not for its own length after: senders that flush their spools
        after a partition are as late, and a node that died meanwhile must not wait that long."""
        latest: dict[str, float] = {}  # a sender's news is as late as its freshest report
        for sender, ts in stamps:
            if math.isfinite(ts) and ts > latest.get(sender, -math.inf):
                latest[sender] = ts
        late: list[float] = []
        late_offsets: list[float] = []
        with self._lock:
            offsets = self._offsets
            for sender, ts in latest.items():
                offset = now - ts
                known = offsets.get(sender)
                if known is None:
                    offsets[sender] = (offset, now, math.inf)
                    continue
                usual_offset, heard, usual_gap = known
                drift = OFFSET_DRIFT * (now - heard)
                usual = min(offset, usual_offset + drift)
                gap = now - heard
                offsets[sender] = (usual, now, min(gap, usual_gap + drift))
                late_offsets.append(offset - usual)
                late.append(max(offset - usual, gap - usual_gap if usual_gap < gap else 0.0))
            if len(offsets) > 2 * len(late) + 1024:  # forget senders gone for a while (bounded)
                kept = now - self.settle - self.forget_s
                self._offsets = {k: v for k, v in offsets.items() if v[1] >= kept}
            if len(late) < 2:
                return  # one sender's lateness may be its own
            self.arrival_lag = _quantile(late)
            # the senders' queues drain for about as long as they are late after the hub caught up
            if since_lag < self.settle + self.arrival_lag:
                self._note(now, self.arrival_lag)
            else:
                offset_lag = _quantile(late_offsets)
                if offset_lag >= self.arrival_floor:  # only while seen: senders flushing spools
                    self._note(now, offset_lag, own=False)  # after an outage are late as long

    def _note(self, now: float, reading: float, own: bool = True) -> None:
        """A delay of ``reading`` seen at ``now``, in force for its own length after (``own``) or not."""
        if reading <= 0:
            return
        until = now + self.settle + (reading if own else 0.0) + self.interval
        # a reading in force no longer, or no larger and ending no sooner than another, is moot
        if any(d >= reading and end >= until for d, end in self._held):
            return
        held = [(d, end) for d, end in self._held if end > now and (d > reading or end > until)]
        held.append((reading, until))
        if len(held) > MAX_HELD:
            held.sort(key=lambda h: h[1])  # by end: then by falling reading (none dominates another)
            # merge the two neighbours that cost the least: the larger reading until the later end
            i = min(
                range(len(held) - 1),
                key=lambda k: (held[k][0] - held[k + 1][0]) * (held[k + 1][1] - held[k][1]),
            )
            held[i : i + 2] = [(held[i][0], held[i + 1][1])]
        self._held = held

    def delay(self, now: float) -> float:
        """How long the hub made its senders' news wait, as a silence verdict at ``now`` allows for."""
        with self._lock:
            self._note(now, now - self._loop_due)  # a loop blocked now delays everyone from now on
            return max((d for d, end in self._held if end > now), default=0.0)

    def loop_overdue(self, now: float) -> float:
        """How late the event loop runs now: its last timer's lag, or how long its next is overdue."""
        with self._lock:
            return max(self.loop_lag, now - self._loop_due)

    def status(self, now: float) -> dict[str, Any]:
        """For /api/v1/health (inside ``overload``)."""
        return {
            "delay_seconds": round(self.delay(now), 3),
            "event_loop_lag_seconds": round(self.loop_lag, 3),
            "evaluation_lag_seconds": round(self.evaluation_lag, 3),
            "arrival_lag_seconds": round(self.arrival_lag, 3),
            "event_loop_probes": self.loop_probes,
        }

    def __len__(self) -> int:
        """Senders whose usual offset is kept, and readings in force (the hub's structure sizes)."""
        return len(self._offsets) + len(self._held)
