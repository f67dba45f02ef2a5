"""Silences: matchers with a start and an expiry that keep matching alerts from notifying.

A silence mutes notifications, never detection: the alert still fires, is stored and is listed
(marked silenced), and when the silence expires while it still fires, it is notified then.
Silences are persisted, so a hub restart does not unmute a maintenance someone announced.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.labels import Matcher, matches_all, parse_matchers
from gpuscope.alert.statedb import StateBackend
from gpuscope.keys import check_keys
from gpuscope.model import Labels


@dataclass(slots=True)
class Silence:
    id: str
    matchers: list[Matcher]
    starts_at: float
    ends_at: float
    created_by: str = "gpuscope"
    comment: str = ""

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def mutes(self, labels: Labels, now: float) -> bool:
        return self.active(now) and matches_all(self.matchers, labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": [m.to_dict() for m in self.matchers],
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "created_by": self.created_by,
            "comment": self.comment,
        }

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Silence:
        return Silence(
            id=str(doc["id"]),
            matchers=[Matcher(m["name"], m["op"], m["value"]) for m in doc["matchers"]],
            starts_at=float(doc["starts_at"]),
            ends_at=float(doc["ends_at"]),
            created_by=str(doc.get("created_by", "")),
            comment=str(doc.get("comment", "")),
        )


def new_silence(
    matchers: list[Matcher], now: float, *, duration: float, starts_at: float | None = None, **kw: str
) -> Silence:
    """A silence from ``starts_at`` (default now) for ``duration`` seconds; it must match something."""
    if not matchers:
        raise ValueError("a silence needs at least one matcher (it would mute every alert)")
    if not math.isfinite(duration) or duration <= 0:
        raise ValueError(f"a silence needs a positive duration, got {duration!r}")
    start = now if starts_at is None else starts_at
    return Silence(f"sil-{secrets.token_hex(4)}", matchers, start, start + duration, **kw)


class Silences:
    """The set of silences, persisted in the state database."""

    def __init__(self, db: StateBackend) -> None:
        self.db = db
        self._items: dict[str, Silence] = self._load()

    def _load(self) -> dict[str, Silence]:
        return {
            str(sid): Silence.from_dict(orjson.loads(doc))
            for sid, doc in self.db.query("SELECT id, doc FROM silences")
        }

    def _current(self) -> dict[str, Silence]:
        """The silences now: re-read when other hubs (sharing the database) may have added some."""
        if self.db.shared:
            self._items = self._load()
        return self._items

    def add(self, silence: Silence) -> Silence:
        with self.db.tx() as con:
            con.execute(
                "INSERT OR REPLACE INTO silences VALUES (?, ?, ?)",
                (silence.id, orjson.dumps(silence.to_dict()).decode(), silence.ends_at),
            )
        self._items[silence.id] = silence
        return silence

    def expire(self, silence_id: str, now: float) -> Silence:
        """End a silence now (it stays listed as expired)."""
        silence = self._current().get(silence_id)
        if silence is None:
            raise KeyError(silence_id)
        silence.ends_at = min(silence.ends_at, now)
        return self.add(silence)

    def muting(self, labels: Labels, now: float) -> Silence | None:
        """The first active silence that mutes these labels."""
        return next((s for s in self._current().values() if s.mutes(labels, now)), None)

    def list(self, now: float, include_expired: bool = False) -> list[Silence]:
        items = sorted(self._current().values(), key=lambda s: (s.starts_at, s.id))
        return [s for s in items if include_expired or s.ends_at > now]


def parse_config_silences(raw: Any, now: float) -> list[Silence]:
    """Static silences from the config: ``{matchers, starts_at?, ends_at? | duration?, comment?}``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("alerting.silences: must be a list")
    out: list[Silence] = []
    for i, item in enumerate(raw):
        where = f"alerting.silences[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be a mapping")
        check_keys(item, where, {"matchers", "match", "starts_at", "ends_at", "duration", "comment"})
        matchers = parse_matchers(item.get("matchers", item.get("match")), f"{where}.matchers")
        starts = float(item.get("starts_at", now))
        if "ends_at" in item:
            duration = float(item["ends_at"]) - starts
        else:
            duration = parse_duration(item.get("duration", "1h"), f"{where}.duration")
        try:
            silence = new_silence(
                matchers, now, duration=duration, starts_at=starts, comment=str(item.get("comment", ""))
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        silence.id = f"sil-config-{i}"
        silence.created_by = "config"
        out.append(silence)
    return out
