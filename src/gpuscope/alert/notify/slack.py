"""Slack incoming webhook: one message per notification, P1 first, with cost and the first diagnosis."""

from __future__ import annotations

from typing import Any, ClassVar

from gpuscope.alert.notify.base import AlertView, Notification, Notifier, Request, register_notifier

_COLORS = {"P1": "#d00000", "P2": "#f2a900", "P3": "#2f80ed", "resolved": "#2eb67d"}


def _line(a: AlertView) -> str:
    where = " ".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k in _PLACE)
    cost = f" · ${a.cost_per_hour:,.0f}/h" if a.status == "firing" and a.cost_per_hour else ""
    text = f"*{a.labels.get('severity', '?')} {a.labels.get('alertname', '?')}* {where}{cost}\n"
    text += a.annotations.get("summary", "")
    if a.status == "firing" and a.annotations.get("diagnosis"):
        text += f"\n_diagnosis_: {a.annotations['diagnosis']}"
    return text


_PLACE = ("node", "gpu", "job", "rank", "service", "model", "version")


@register_notifier
class SlackNotifier(Notifier):
    kind = "slack"
    keys: ClassVar[frozenset[str]] = frozenset({"url", "channel"})

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        super().__init__(name, settings)
        self.url = self._url()
        self.channel = settings.get("channel")

    def render(self, notification: Notification) -> list[Request]:
        alerts = sorted(
            notification.alerts, key=lambda a: (a.status != "firing", a.labels.get("severity", ""))
        )
        firing = [a for a in alerts if a.status == "firing"]
        head = (
            f"[{notification.status.upper()}] {len(firing)} firing, {len(alerts) - len(firing)} resolved"
            + (f" · escalation {notification.escalation}" if notification.escalation else "")
        )
        color = _COLORS["resolved"] if not firing else _COLORS.get(firing[0].labels.get("severity", ""), "")
        body: dict[str, Any] = {
            "text": head,
            "attachments": [{"color": color, "mrkdwn_in": ["text"], "text": "\n\n".join(map(_line, alerts))}],
        }
        if isinstance(self.channel, str):
            body["channel"] = self.channel
        return [Request(self.url, body)]
