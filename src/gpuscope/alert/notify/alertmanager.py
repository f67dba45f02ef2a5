"""Push to a real Alertmanager through its API v2 (``POST /api/v2/alerts``).

Alertmanager keeps its own state and expires an alert at ``endsAt``: a firing alert is sent with an
``endsAt`` a few resend intervals ahead and re-sent every interval while it fires (as Prometheus
does), and a resolved one is sent once with the time it resolved. Alertmanager does its own grouping,
so this receiver is notified of every change at once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gpuscope.alert.notify.base import Notification, Notifier, Request, register_notifier, rfc3339


@register_notifier
class AlertmanagerNotifier(Notifier):
    kind = "alertmanager"
    keys: ClassVar[frozenset[str]] = frozenset({"url"})
    resend_interval: ClassVar[float | None] = 60.0

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        super().__init__(name, settings)
        self.url = self._url().rstrip("/") + "/api/v2/alerts"

    def render(self, notification: Notification) -> list[Request]:
        assert self.resend_interval is not None
        valid_until = notification.created_at + 4 * self.resend_interval
        body = [
            {
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(valid_until if a.status == "firing" else a.ends_at),
                "generatorURL": f"{notification.external_url}/api/v1/alerts?state=all#{a.id}"
                if notification.external_url
                else "",
            }
            for a in notification.alerts
        ]
        return [Request(self.url, body)]
