"""Heartbeats in memory, transitions in the store: what the shared meta store keeps of them.

Every training rank beats once a second; a PostgreSQL row per beat is a write per rank and second
that nobody reads back (the detectors see heartbeats live, as they arrive). The meta store keeps
each rank's last heartbeat in this process's memory (the hub its SDK sends to: its shard's owner)
and stores only the transitions: ``heartbeat_seen`` when a rank beats for the first time, or
again after a silence, and ``heartbeat_lost`` (at the time of its last beat) once it has been
silent for ``lost_after`` seconds. Steady heartbeats cause no write at all.

The transitions have kinds of their own so that a hub warming its detectors up from the store
(start, shard takeover) does not take a rank's first beat for its last: the detectors learn the
ranks again from the next live beats. What this hub's memory held is lost with it; a sender that
moves to another hub shows as lost here and seen there.
"""

from __future__ import annotations

import threading

from gpuscope.model import Event

HEARTBEAT = "heartbeat"
SEEN = "heartbeat_seen"
LOST = "heartbeat_lost"
#: silence after which a rank's loss is stored (its liveness alert fires far sooner)
LOST_AFTER_S = 60.0

RankKey = tuple[tuple[str, str], ...]


def _key(event: Event) -> RankKey:
    labels = event.labels
    if "job" in labels and "rank" in labels:
        return (("job", labels["job"]), ("rank", labels["rank"]))
    return tuple(sorted(labels.items()))


class HeartbeatMemory:
    """The last heartbeat of every rank beating now; :meth:`sift` says what to store."""

    def __init__(self, lost_after: float = LOST_AFTER_S) -> None:
        self.lost_after = lost_after
        self._last: dict[RankKey, Event] = {}
        self._lock = threading.Lock()
        self._swept = float("-inf")
        self._newest = float("-inf")  # silences are measured in the beats' own time
        #: heartbeats kept in memory only
        self.kept = 0

    def __len__(self) -> int:
        return len(self._last)

    def sift(self, events: list[Event]) -> list[Event]:
        """``events`` without their steady heartbeats, with the transitions due by now (the
        newest beat's time: a spool replayed late is judged by when it was beaten)."""
        out: list[Event] = []
        with self._lock:
            for event in events:
                if event.kind != HEARTBEAT:
                    out.append(event)
                    continue
                key = _key(event)
                last = self._last.get(key)
                if last is None or event.ts - last.ts > self.lost_after:
                    if last is not None:
                        out.append(Event(last.ts, LOST, last.labels, last.data))
                    out.append(Event(event.ts, SEEN, event.labels, event.data))
                else:
                    self.kept += 1
                if last is None or event.ts >= last.ts:
                    self._last[key] = event
                self._newest = max(self._newest, event.ts)
            if self._newest - self._swept >= self.lost_after / 4:
                self._swept = self._newest
                out += self._sweep(self._newest)
        return out

    def _sweep(self, now: float) -> list[Event]:
        """The ranks silent for ``lost_after``: their loss, at their last beat; then forgotten."""
        gone = [key for key, last in self._last.items() if now - last.ts > self.lost_after]
        return [
            Event(last.ts, LOST, last.labels, last.data) for last in (self._last.pop(key) for key in gone)
        ]
