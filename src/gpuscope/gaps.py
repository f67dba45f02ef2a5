"""Silence the hub or the cluster caused is not the senders': the one place that holds silence verdicts.

A silence verdict (``node_unreachable``, ``rank_lost``, ``training_stalled``) says a sender has not
been heard for longer than its threshold. Two things other than the sender can make it silent, and
each is a *source* of sender gaps here:

- ``overload``: the hub itself refused the sender's requests (503 + ``Retry-After``: the sender
  spools and comes back) or made every request wait (its event loop, its oldest request in flight,
  its evaluation ran late; its senders' news arrived late, queued before it was admitted).
  :class:`~gpuscope.ingest.overload.OverloadMonitor` reports what it did
  (:class:`~gpuscope.ingest.overload.ShedCover`) at each evaluation. The gap it made a sender it
  refused (matched by the identity a sender names in ``X-Gpuscope-Sender``; every sender while it
  refused one that named nobody) ends at its settle time after the last refusal, and the sender's
  silence is measured from then: its verdict is held until the gap's end plus its threshold plus
  the hub's delay (what it spooled meanwhile queues on its way back like everyone's news). Any
  other sender's verdict is held while its silence is within its threshold plus the delay the hub
  made every request wait. A sender the hub did not refuse (a node that died) is judged at its
  threshold plus that delay, however long the hub stays behind. A node or a rank that names
  itself (``node=``; ``job=,rank=``) is also judged by its knocks
  (:class:`~gpuscope.ingest.overload.Wire`): a refused sender keeps knocking, a dead one stops,
  so one that has not knocked for its threshold plus the settle time is judged as on a healthy
  hub, whatever the delay (the delay is how late the spools' data arrives, not how late a knock is).
  A job's stall is judged by its ranks' own data instead: its verdict is not held once every
  rank's heartbeats that the hub took and its detectors saw show the job at one step for the
  stall's threshold in the ranks' own time (:data:`STILL_DETAIL`). The hub's refusals and delay
  make that evidence late, never make it (a rank's stream arrives in order), so a job that hangs
  while its requests are refused at every synchronised second is found at its threshold plus the
  lag of its data, not once the hub has caught up.
- ``takeover``: when a hub takes shards over (a member died, left or joined), the senders of those
  shards are moving: they notice the old owner is gone at their next send, fail over, and the
  answer names the new owner. Their verdicts are held until the failover grace has passed.

A takeover's hold ends when the failover grace has passed, sized to when the moving senders are
back: the detectors keep reporting a sender that is still silent, so a sender that is really gone
is alerted at the end of the hold at the latest. A verdict on an alert that is already firing is
never held, so a hold cannot resolve it.
Counted per source: ``silence_verdicts_held_overload``, ``silence_verdicts_held_takeover``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal

from gpuscope.counters import Counters
from gpuscope.detect.baseline import finite_or_none
from gpuscope.ingest.overload import SenderKey, ShedCover, covers, node_sender, rank_sender
from gpuscope.model import Alert, Finding, Labels
from gpuscope.rules import NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED

#: the rules that judge a sender by its silence
SILENCE_RULES = frozenset({NODE_UNREACHABLE, RANK_LOST, TRAINING_STALLED})
#: the detail in which ``training_stalled`` says how long every rank's own heartbeats, accepted and
#: seen by the detectors, show the job at one step, in the ranks' own time: a stall the hub's lag
#: or refusals can delay but not make
STILL_DETAIL = "event_seconds_since_step"

Held = Callable[[Labels], bool]
Source = Literal["overload", "takeover"]


def wire_sender(rule: str, entity: Labels) -> SenderKey | None:
    """The sender whose knocks tell whether ``entity`` is alive, for a verdict of ``rule`` (None:
    no single sender does: a job's stall is its steps, not its processes' presence)."""
    if rule == NODE_UNREACHABLE and "node" in entity:
        return node_sender(entity["node"])
    if rule == RANK_LOST and "job" in entity and "rank" in entity:
        return rank_sender(entity["job"], entity["rank"])
    return None


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
        for sender in cover.refused:
            for pair in sender:
                self._named.setdefault(pair, []).append(sender)

    def _gap_end(self, entity: Labels) -> float:
        """When the gap the hub made by refusing the senders of ``entity`` ends (-inf: none)."""
        shed = self._shed
        end = shed.everyone_until
        for pair in entity.items():
            for sender in self._named.get(pair, ()):
                if covers(sender, entity):
                    end = max(end, shed.refused[sender])
        return end

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
        threshold = finding.details.get("threshold_seconds")
        known = isinstance(threshold, int | float)
        allowed = float(threshold) if isinstance(threshold, int | float) else 0.0
        sender = wire_sender(finding.rule, finding.entity)
        if known and sender is not None and shed.wire.dead(sender, allowed):
            return None  # it stopped knocking: no refusal or delay of the hub's explains that
        still = finding.details.get(STILL_DETAIL)
        if known and finding.rule == TRAINING_STALLED and isinstance(still, int | float) and still >= allowed:
            return None  # its ranks' own data, taken and seen, show no step for its threshold
        # silence measured from the gap's end, and the sender's spool then waits like everyone's
        if now < self._gap_end(finding.entity) + allowed + shed.delay:
            return "overload"
        silence = finding.value
        # every request waited up to ``delay``: so may this sender's have
        if shed.delay > 0 and (silence is None or not known or silence < allowed + shed.delay):
            return "overload"
        return None

    def apply(
        self, findings: list[Finding], now: float, firing: Callable[[], Iterable[Alert]]
    ) -> list[Finding]:
        """``findings`` less the silence verdicts held at ``now`` on alerts not already firing."""
        self._takeovers = [(held, until) for held, until in self._takeovers if until > now]
        shed = self._shed
        if not self._takeovers and not shed.refused and shed.everyone_until == -math.inf and shed.delay <= 0:
            return [self._judged(f) for f in findings]
        fired = {(a.rule, tuple(sorted(a.entity.items()))) for a in firing() if a.rule in SILENCE_RULES}
        out = []
        for finding in findings:
            source = self.source(finding, now)
            if source is not None and (finding.rule, tuple(sorted(finding.entity.items()))) not in fired:
                self.counters.inc(f"silence_verdicts_held_{source}")
                continue
            out.append(self._judged(finding))
        return out

    def _judged(self, finding: Finding) -> Finding:
        """``finding`` with what its verdict was judged against, when it is a silence verdict: the
        hub's delay and the end of the gap its refusals made (for the triage of a false alarm)."""
        if finding.rule in SILENCE_RULES:
            finding.details["hub_delay_seconds"] = self._shed.delay
            finding.details["hub_gap_end_ts"] = finite_or_none(self._gap_end(finding.entity))
            sender = wire_sender(finding.rule, finding.entity)
            if sender is not None:
                finding.details["wire_silence_seconds"] = self._shed.wire.silence(sender)
        return finding
