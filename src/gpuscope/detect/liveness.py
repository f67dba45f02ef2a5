"""Who went quiet: silence judged on the hub's clock, learned per sender, blind to hub pauses and
to the hub's own lag.

Senders' clocks may be skewed from the hub's, so arrival is stamped with the hub's evaluation
time (``now``), never compared to the sender's own timestamps. Each sender's period is learned
from its timestamps (:class:`IntervalEstimator`); it is overdue after
``max(factor x period, floor)`` of silence.

If *every* sender goes quiet at once, the fault is the hub's (paused, partitioned, restarting),
not theirs: while that lasts nobody new is declared overdue, and when traffic resumes every
sender's silence is measured from the resumption. Senders already overdue before stay overdue.
(What the hub knows it did itself, shedding or queueing senders' requests, and a cluster's
takeover are held after the verdict, in :mod:`gpuscope.gaps`.)

Silence is also judged in event time, against the fleet's watermark. Each sender's offset (hub
clock minus its clock, at its promptest delivery: skew plus the least transit) is learned as the
smallest ``arrival - timestamp`` seen; what arrives later than that is delayed. The fleet's
*watermark lag* is the median delay of what arrived at the latest update, from the senders and
from *witnesses* (other senders whose arrival shows how late the hub's intake runs, such as the
nodes' agents for training ranks, which send in fewer, larger batches). When the hub (or the
network, or a load generator) is behind, everything arrives late together and a sender that was
not heard for a while, but whose newest timestamp is as recent as the fleet's, is not silent.
A sender is overdue when it is silent on the hub's clock and, while the watermark lags by more
than a quarter of its threshold, also silent for its threshold in event time
(``event_silence = now - watermark_lag - (last timestamp + offset)``). A dead sender among live
ones stops advancing while the watermark moves on, so it is found as before (later only by what
the fleet lags). A verdict is never earlier than on the hub's clock alone. A sender first heard
while the hub already lagged learns too large an offset: while the lag lasts, its own verdict
comes later by as much as the lag was when it joined.

Neither withholding applies to a sender the hub knows stopped knocking (``dead``, from its requests
of any kind, refused ones too: :class:`~gpuscope.ingest.overload.Wire`): a refused sender keeps
coming back, a dead one does not, so its silence on the hub's clock is its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from statistics import median
from typing import Generic, TypeVar

from gpuscope.detect.baseline import IntervalEstimator

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Sender:
    clock: IntervalEstimator = field(default_factory=IntervalEstimator)
    heard_at: float = -math.inf
    #: hub clock minus the sender's clock at its promptest delivery (skew plus the least transit)
    offset: float = math.inf
    fresh: bool = False
    down: bool = False


@dataclass(slots=True)
class _Witness:
    offset: float = math.inf
    last: float = -math.inf
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Overdue(Generic[K]):
    key: K
    silence: float  # seconds of silence on the hub's clock
    threshold: float
    last_ts: float  # the sender's own timestamp of its last report
    #: how far its newest timestamp is behind the fleet's watermark (== ``silence`` when unknown)
    event_silence: float = math.nan
    watermark_lag: float = 0.0  # how far the fleet's watermark was behind the hub's clock


class Liveness(Generic[K]):
    """Tracks senders (nodes, ranks) and reports the ones silent past their learned threshold.

    ``min_reports`` reports are needed before a sender is judged (its period must be known);
    with ``default_interval`` set, one report is enough and the default stands in until learned.
    A hub-side gap is only recognised with at least ``gap_min_senders`` live senders: a single
    sender falling silent is indistinguishable from a hub pause and is reported.
    """

    def __init__(
        self,
        *,
        factor: float = 4.0,
        floor: float = 4.0,
        min_reports: int = 2,
        default_interval: float | None = None,
        gap_min_senders: int = 2,
    ) -> None:
        if factor <= 0 or floor < 0:
            raise ValueError(f"factor must be positive and floor non-negative, got {factor}, {floor}")
        self.factor = factor
        self.floor = floor
        self.min_reports = 1 if default_interval is not None else max(min_reports, 2)
        self.default_interval = default_interval
        self.gap_min_senders = gap_min_senders
        self._senders: dict[K, _Sender] = {}
        self._fresh: list[_Sender] = []
        self._resumed: list[_Sender] = []
        self._witnesses: dict[Hashable, _Witness] = {}
        self._fresh_witnesses: list[_Witness] = []
        self._traffic = False
        self._last_traffic: float | None = None
        self.in_gap = False
        self.gap_end = -math.inf
        self.suppressed = 0  # overdue verdicts withheld because the hub itself heard nothing
        #: overdue verdicts withheld because the sender is as recent as the fleet in event time
        self.withheld_watermark = 0
        #: median delay (beyond each sender's promptest) of what arrived at the latest update
        self.watermark_lag = 0.0
        #: the largest event-time silence among the verdicts withheld at the latest evaluation
        self.withheld_event_silence = 0.0
        #: verdicts a hub gap or the watermark would have withheld, given as the sender stopped knocking
        self.found_on_wire = 0

    def beat(self, key: K, ts: float) -> None:
        """``key`` reported data stamped ``ts`` (its own clock)."""
        sender = self._senders.get(key)
        if sender is None:
            sender = self._senders[key] = _Sender()
        sender.clock.push(ts)
        if not sender.fresh:
            sender.fresh = True
            self._fresh.append(sender)
        self._traffic = True

    def traffic(self) -> None:
        """Something arrived that is not a sender's beat: the hub is evidently hearing."""
        self._traffic = True

    def witness(self, key: Hashable, ts: float) -> None:
        """Something stamped ``ts`` arrived from ``key``, which is not judged here: how late it
        came counts toward the watermark lag (and the hub is evidently hearing)."""
        self._traffic = True
        if not math.isfinite(ts):
            return
        seen = self._witnesses.get(key)
        if seen is None:
            seen = self._witnesses[key] = _Witness()
        if ts > seen.last:
            seen.last = ts
            if not seen.fresh:
                seen.fresh = True
                self._fresh_witnesses.append(seen)

    @property
    def withholding(self) -> bool:
        """Are verdicts on senders not yet overdue withheld now (every sender quiet: a hub gap)?"""
        return self.in_gap

    def forget(self, key: K) -> None:
        self._senders.pop(key, None)

    def resume(self, key: K) -> None:
        """Excuse ``key``'s silence so far: it is measured again from the next update, as if the
        sender had just been heard (without counting it as a delivery for the watermark)."""
        sender = self._senders.get(key)
        if sender is not None:
            sender.down = False
            self._resumed.append(sender)

    def __contains__(self, key: object) -> bool:
        return key in self._senders

    def keys(self) -> Iterator[K]:
        return iter(self._senders)

    def heard_at(self, key: K) -> float | None:
        """Hub time at which ``key`` was last heard (None when unknown)."""
        sender = self._senders.get(key)
        return None if sender is None else sender.heard_at

    def threshold(self, key: K) -> float | None:
        sender = self._senders.get(key)
        return None if sender is None else self._threshold(sender)

    def _threshold(self, sender: _Sender) -> float | None:
        if sender.clock.reports < self.min_reports:
            return None
        interval = sender.clock.interval or self.default_interval
        return None if interval is None else max(self.factor * interval, self.floor)

    def update(self, now: float) -> None:
        """Stamp what arrived since the last call with ``now``, measure how late it came (the
        watermark lag) and track hub-wide silence."""
        delays: list[float] = []
        for sender in self._fresh:
            sender.heard_at = now
            sender.fresh = False
            sender.down = False
            last = sender.clock.last
            if last is not None:
                arrival = now - last
                if arrival < sender.offset:
                    sender.offset = arrival
                delays.append(arrival - sender.offset)
        self._fresh.clear()
        for sender in self._resumed:
            sender.heard_at = max(sender.heard_at, now)
        self._resumed.clear()
        for seen in self._fresh_witnesses:
            seen.fresh = False
            arrival = now - seen.last
            if arrival < seen.offset:
                seen.offset = arrival
            delays.append(arrival - seen.offset)
        self._fresh_witnesses.clear()
        if delays:
            self.watermark_lag = median(delays)
        if self._traffic:
            if self.in_gap:
                self.gap_end = now
                self.in_gap = False
            self._last_traffic = now
            self._traffic = False
        elif self._last_traffic is not None and not self.in_gap:
            self.in_gap = self._hub_gap(now - self._last_traffic)

    def replayed(self, now: float) -> None:
        """What was beaten since the last update is replayed history: stamp each sender at its own
        last timestamp (capped at ``now``), so a sender silent before the replay stays silent
        from then, not from the next evaluation."""
        for sender in self._fresh:
            last = sender.clock.last
            stamp = now if last is None else min(last, now)
            sender.heard_at = max(sender.heard_at, stamp)
            sender.fresh = False
            sender.down = False
        self._fresh.clear()
        for seen in self._fresh_witnesses:
            seen.fresh = False
        self._fresh_witnesses.clear()

    def _hub_gap(self, silence: float) -> bool:
        live = [t for s in self._senders.values() if not s.down and (t := self._threshold(s)) is not None]
        return len(live) >= self.gap_min_senders and silence >= min(live)

    def event_silence(self, key: K, now: float) -> float | None:
        """How far ``key``'s newest timestamp is behind the fleet's watermark at ``now`` (None
        when its offset is not known yet)."""
        sender = self._senders.get(key)
        return None if sender is None else self._event_silence(sender, now)

    def _event_silence(self, sender: _Sender, now: float) -> float | None:
        last = sender.clock.last
        if last is None or not math.isfinite(sender.offset):
            return None
        return now - self.watermark_lag - (last + sender.offset)

    def overdue(self, now: float, dead: Callable[[K, float], bool] | None = None) -> list[Overdue[K]]:
        """Senders silent for at least their threshold at ``now`` (calls :meth:`update` first).
        ``dead(key, threshold)``: has the sender stopped knocking on the hub for its threshold
        (then neither a hub gap nor the watermark withholds its verdict)."""
        self.update(now)
        out: list[Overdue[K]] = []
        lag = self.watermark_lag
        self.withheld_event_silence = 0.0
        for key, sender in self._senders.items():
            threshold = self._threshold(sender)
            if threshold is None:
                continue
            since = sender.heard_at if sender.down else max(sender.heard_at, self.gap_end)
            silence = now - since
            if silence < threshold:
                continue
            behind = self._event_silence(sender, now)
            gap = self.withholding and not sender.down
            # the fleet is late in event time and this sender is as recent as the fleet
            late = not sender.down and behind is not None and lag > threshold / 4 and behind < threshold
            if (gap or late) and dead is not None and dead(key, threshold):
                self.found_on_wire += 1
            elif gap:
                self.suppressed += 1
                continue
            elif late:
                self.withheld_watermark += 1
                self.withheld_event_silence = max(self.withheld_event_silence, behind or 0.0)
                continue
            sender.down = True
            event = silence if behind is None else behind
            out.append(Overdue(key, silence, threshold, sender.clock.last or math.nan, event, lag))
        return out
