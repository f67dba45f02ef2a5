"""The notifier seam: a notifier turns one notification into the HTTP requests a receiver expects.

A notifier is one module that subclasses :class:`Notifier` and registers itself with
:func:`register_notifier` under the key users write in a receiver (``webhook:``, ``slack:``, ...).
Rendering happens when the notification is queued, so the persisted outbox holds exactly the bytes
to send and a retry after a restart sends the same thing.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuscope.alert.routing import Timing

ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts: float | None) -> str:
    """Alertmanager's time format; ``None`` is its zero time (still firing)."""
    if ts is None:
        return ZERO_TIME
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class AlertView:
    """What a receiver is told about one alert, frozen at the time of the notification."""

    id: str
    fingerprint: str
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None
    cost_per_hour: float


@dataclass(frozen=True, slots=True)
class Notification:
    receiver: str
    group_key: str
    group_labels: dict[str, str]
    alerts: list[AlertView]
    external_url: str = ""
    escalation: int = 0  # 0: routed normally; n: the n-th escalation of an unacknowledged alert
    created_at: float = 0.0

    @property
    def status(self) -> str:
        return "firing" if any(a.status == "firing" for a in self.alerts) else "resolved"

    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP POST with a JSON body: the unit the outbox stores and retries."""

    url: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class Notifier(ABC):
    """Base class; ``settings`` is the receiver's mapping under its kind key."""

    kind: ClassVar[str] = ""
    #: the keys its settings mapping may have (anything else is refused by name at start-up)
    keys: ClassVar[frozenset[str]] = frozenset({"url"})
    #: receivers that keep their own alert state (Alertmanager) want firing alerts re-sent this often
    resend_interval: ClassVar[float | None] = None

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        self.name = name
        self.settings = settings

    def timing(self, routed: Timing) -> Timing:
        """The group timing this receiver runs under (a stateful receiver groups by itself)."""
        if self.resend_interval is None:
            return routed
        return Timing(group_wait=0.0, group_interval=0.0, repeat_interval=self.resend_interval)

    @abstractmethod
    def render(self, notification: Notification) -> list[Request]:
        """The requests that deliver ``notification`` to this receiver."""

    def _url(self, key: str = "url") -> str:
        url = self.settings.get(key)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            # the value itself is not echoed: receivers' URLs carry secrets
            got = f"scheme {url.split(':', 1)[0][:16]!r}" if isinstance(url, str) else type(url).__name__
            raise ValueError(f"receiver {self.name}: {self.kind}.{key} must be an http(s) URL, got {got}")
        return url


NOTIFIERS: dict[str, type[Notifier]] = {}


def register_notifier(cls: type[Notifier]) -> type[Notifier]:
    """Class decorator: make a notifier available under its ``kind``."""
    if not cls.kind or cls.kind in NOTIFIERS:
        raise ValueError(f"notifier kind {cls.kind!r} is empty or registered twice")
    NOTIFIERS[cls.kind] = cls
    return cls
