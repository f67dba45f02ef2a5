"""Generic webhook: the Alertmanager webhook payload, version 4, so existing receivers work as is."""

from __future__ import annotations

from typing import Any, ClassVar

from gpuscope.alert.notify.base import Notification, Notifier, Request, register_notifier, rfc3339


def webhook_payload(n: Notification) -> dict[str, Any]:
    """The body Alertmanager's webhook_config POSTs (version 4)."""
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": 0,
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels(),
        "commonAnnotations": n.common_annotations(),
        "externalURL": n.external_url,
        "alerts": [
            {
                "status": a.status,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(a.ends_at),
                "generatorURL": f"{n.external_url}/api/v1/alerts?state=all#{a.id}" if n.external_url else "",
                "fingerprint": a.fingerprint,
            }
            for a in n.alerts
        ],
    }


@register_notifier
class WebhookNotifier(Notifier):
    kind = "webhook"
    keys: ClassVar[frozenset[str]] = frozenset({"url", "headers"})

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        super().__init__(name, settings)
        self.url = self._url()
        headers = settings.get("headers", {})
        if not isinstance(headers, dict):
            raise ValueError(f"receiver {name}: webhook.headers must be a mapping")
        self.headers = {str(k): str(v) for k, v in headers.items()}

    def render(self, notification: Notification) -> list[Request]:
        return [Request(self.url, webhook_payload(notification), self.headers)]
