"""Silence the hub or the cluster caused is not the senders': the one place that holds silence verdicts.

A silence verdict (``node_unreachable``, ``rank_lost``, ``training_stalled``) says a sender has not
been heard for longer than its threshold. Two things other than the sender can make it silent, and
each is a *source* of sender gaps here:

- ``overload``: the hub itself refused the sender's requests (503 + ``Retry-After``: the sender
  spools and comes back) or holds them in flight, or made every request wait (its event loop, its
  oldest request ran late). :class:`~gpuscope.ingest.overload.OverloadMonitor` reports what it did
  (:class:`~gpuscope.ingest.overload.ShedCover`) at each evaluation. A verdict is held on the
  senders it refused within its settle time (matched by the identity a sender names in
  ``X-Gpuscope-Sender``), on every sender while it refused one that named nobody, and on any
  sender while its silence is within its threshold plus the delay the hub made every request wait
  (its event loop, its oldest request in flight). A sender the hub did not refuse (a node that
  died) is judged at its threshold plus that delay, however long the hub stays behind.
- ``takeover``: when a hub takes shards over (a member died, left or joined), the senders of those
  shards are moving: they notice the old owner is gone at their next send, fail over, and the
  answer names the new owner. Their verdicts are held until the failover grace has passed.

Both end a hold at the time by which the senders it covers are back (the overload monitor's settle
time after the last refusal, the failover grace after the takeover): the detectors keep reporting a
sender that is still silent, so a sender that is really gone is alerted at the end of the hold at
the latest. A verdict on an alert that is already firing is never held, so a hold cannot resolve it.
Counted per source: ``silence_verdicts_held_overload``, ``silence_verdicts_held_takeover``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from gpuscope.counters import Counters
from gpuscope.ingest.overload import SenderKey, ShedCover, covers
from gpuscope.model import Alert, Finding, Labels
from gpuscope.rules import NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED

#: the rules that judge a sender by its silence
SILENCE_RULES = frozenset({NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED})

Held = Callable[[Labels], bool]
Source = Literal["overload", "takeover"]


class SenderGaps:
    """Holds on silence verdicts from every source; see the module docstring."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._takeovers: list[tuple[Held, float]] = []
        self._shed = ShedCover()
        #: the senders of :attr:`_shed`, by each label they name (a verdict looks up its own labels)
        self._named: dict[tuple[str, str], list[SenderKey]] = {}

    def hold(self, held: Held, until: float) -> None:
        """A takeover: hold the verdicts on the entities ``held`` selects until hub time ``until``."""
        self._takeovers.append((held, until))

    def shed(self, cover: ShedCover) -> None:
        """What the hub's overload monitor did to its senders, as of this evaluation."""
        self._shed = cover
        self._named = {}
        for sender in cover.senders:
            for pair in sender:
                self._named.setdefault(pair, []).append(sender)

    def _named_sender(self, entity: Labels) -> bool:
        """Did the hub refuse a sender that reports for ``entity``?"""
        for pair in entity.items():
            if any(covers(sender, entity) for sender in self._named.get(pair, ())):
                return True
        return False

    def until(self, entity: Labels, now: float) -> float | None:
        """When the takeover hold on ``entity``'s silence verdicts ends (None: not held at ``now``)."""
        ends = [until for held, until in self._takeovers if until > now and held(entity)]
        return max(ends) if ends else None

    def source(self, finding: Finding, now: float) -> Source | None:
        """The source that holds ``finding`` at ``now`` (None: judged normally)."""
        if finding.rule not in SILENCE_RULES:
            return None
        if any(until > now and held(finding.entity) for held, until in self._takeovers):
            return "takeover"
        shed = self._shed
        if shed.everyone or self._named_sender(finding.entity):
            return "overload"
        if shed.delay > 0:  # every request waited up to ``delay``: so may this sender's have
            silence, threshold = finding.value, finding.details.get("threshold_seconds")
            if silence is None or not isinstance(threshold, int | float) or silence < threshold + shed.delay:
                return "overload"
        return None

    def apply(
        self, findings: list[Finding], now: float, firing: Callable[[], Iterable[Alert]]
    ) -> list[Finding]:
        """``findings`` less the silence verdicts held at ``now`` on alerts not already firing."""
        self._takeovers = [(held, until) for held, until in self._takeovers if until > now]
        shed = self._shed
        if not self._takeovers and not shed.everyone and not shed.senders and shed.delay <= 0:
            return findings
        fired = {(a.rule, tuple(sorted(a.entity.items()))) for a in firing() if a.rule in SILENCE_RULES}
        out = []
        for finding in findings:
            source = self.source(finding, now)
            if source is not None and (finding.rule, tuple(sorted(finding.entity.items()))) not in fired:
                self.counters.inc(f"silence_verdicts_held_{source}")
                continue
            out.append(finding)
        return out
