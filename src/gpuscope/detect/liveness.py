"""Who went quiet: silence judged on the hub's clock, learned per sender, blind to hub pauses.

Senders' clocks may be skewed from the hub's, so arrival is stamped with the hub's evaluation
time (``now``), never compared to the sender's own timestamps. Each sender's period is learned
from its timestamps (:class:`IntervalEstimator`); it is overdue after
``max(factor x period, floor)`` of silence.

If *every* sender goes quiet at once, the fault is the hub's (paused, partitioned, restarting),
not theirs: while that lasts nobody new is declared overdue, and when traffic resumes every
sender's silence is measured from the resumption. Senders already overdue before stay overdue.
(What the hub knows it did itself, shedding or queueing senders' requests, and a cluster's
takeover are held after the verdict, in :mod:`gpuscope.gaps`.)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuscope.detect.baseline import IntervalEstimator

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Sender:
    clock: IntervalEstimator = field(default_factory=IntervalEstimator)
    heard_at: float = -math.inf
    fresh: bool = False
    down: bool = False


@dataclass(frozen=True, slots=True)
class Overdue(Generic[K]):
    key: K
    silence: float  # seconds of silence on the hub's clock
    threshold: float
    last_ts: float  # the sender's own timestamp of its last report


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
        self._traffic = False
        self._last_traffic: float | None = None
        self.in_gap = False
        self.gap_end = -math.inf
        self.suppressed = 0  # overdue verdicts withheld because the hub itself heard nothing

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

    @property
    def withholding(self) -> bool:
        """Are verdicts on senders not yet overdue withheld now (every sender quiet: a hub gap)?"""
        return self.in_gap

    def forget(self, key: K) -> None:
        self._senders.pop(key, None)

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
        """Stamp what arrived since the last call with ``now`` and track hub-wide silence."""
        for sender in self._fresh:
            sender.heard_at = now
            sender.fresh = False
            sender.down = False
        self._fresh.clear()
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

    def _hub_gap(self, silence: float) -> bool:
        live = [t for s in self._senders.values() if not s.down and (t := self._threshold(s)) is not None]
        return len(live) >= self.gap_min_senders and silence >= min(live)

    def overdue(self, now: float) -> list[Overdue[K]]:
        """Senders silent for at least their threshold at ``now`` (calls :meth:`update` first)."""
        self.update(now)
        out: list[Overdue[K]] = []
        for key, sender in self._senders.items():
            threshold = self._threshold(sender)
            if threshold is None:
                continue
            since = sender.heard_at if sender.down else max(sender.heard_at, self.gap_end)
            silence = now - since
            if silence < threshold:
                continue
            if self.withholding and not sender.down:
                self.suppressed += 1
                continue
            sender.down = True
            out.append(Overdue(key, silence, threshold, sender.clock.last or math.nan))
        return out
