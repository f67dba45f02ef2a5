"""PagerDuty Events API v2: one trigger per firing alert and one resolve, both under its dedup key."""

from __future__ import annotations

from typing import Any, ClassVar

from gpuscope.alert.notify.base import Notification, Notifier, Request, register_notifier, rfc3339

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SEVERITY = {"P1": "critical", "P2": "error", "P3": "warning"}


@register_notifier
class PagerDutyNotifier(Notifier):
    kind = "pagerduty"
    keys: ClassVar[frozenset[str]] = frozenset({"routing_key", "url"})

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        super().__init__(name, settings)
        key = settings.get("routing_key")
        if not isinstance(key, str) or not key:
            raise ValueError(f"receiver {name}: pagerduty.routing_key is required")
        self.routing_key = key
        self.url = self._url() if "url" in settings else DEFAULT_URL

    def render(self, notification: Notification) -> list[Request]:
        out: list[Request] = []
        for a in notification.alerts:
            event: dict[str, Any] = {
                "routing_key": self.routing_key,
                "dedup_key": a.fingerprint,
                "event_action": "trigger" if a.status == "firing" else "resolve",
            }
            if a.status == "firing":
                place = {k: v for k, v in a.labels.items() if k in {"node", "gpu", "job", "rank", "service"}}
                event["payload"] = {
                    "summary": a.annotations.get("summary", a.labels.get("alertname", ""))[:1024],
                    "source": ",".join(f"{k}={v}" for k, v in sorted(place.items())) or "gpuscope",
                    "severity": SEVERITY.get(a.labels.get("severity", ""), "warning"),
                    "timestamp": rfc3339(a.starts_at),
                    "component": a.labels.get("node", a.labels.get("service", "")),
                    "group": a.labels.get("job", a.labels.get("incident", "")),
                    "class": a.labels.get("alertname", ""),
                    "custom_details": {
                        **a.annotations,
                        "cost_per_hour": a.cost_per_hour,
                        "escalation": notification.escalation,
                    },
                }
            out.append(Request(self.url, event))
        return out
