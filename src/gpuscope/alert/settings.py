"""The alerting part of the config file: ``receivers``, ``routes`` (DESIGN §5) and ``alerting``.

```yaml
receivers:
  - {name: ops-hook, webhook: {url: "http://127.0.0.1:9000/hook"}}
  - {name: pager, pagerduty: {routing_key: "...", url: "https://events.example/v2/enqueue"}}
routes:
  - {receiver: pager, match: {severity: P1}, group_wait: 0s, repeat_interval: 1h}
  - {receiver: ops-hook, group_by: [incident], group_interval: 1m}
alerting:
  state_path: gpuscope-alerts.sqlite     # outbox, silences, acks, history (default: beside the store)
  external_url: http://hub.example:7470
  pending: {loss_plateau: 10m}           # per-rule pending time; hard faults cannot wait
  flap: {threshold: 4, window: 15m}
  silences: [{matchers: ["job=experiment-7"], duration: 8h, comment: "known bad run"}]
  maintenance: [{name: weekly, matchers: {node: node-3}, weekdays: [sat], start: "02:00", duration: 2h}]
  escalation: [{after: 15m, receiver: pager-secondary}]
  outbox: {base_backoff: 1s, max_backoff: 30s, max_age: 1d}
```
Everything is checked at start-up; an error names the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscope.alert.durations import parse_duration
from gpuscope.alert.engine import check_pending
from gpuscope.alert.escalation import EscalationLevel, parse_escalation
from gpuscope.alert.maintenance import MaintenanceWindow, parse_windows
from gpuscope.alert.notify import load_notifiers
from gpuscope.alert.notify.base import Notifier
from gpuscope.alert.routing import Route, parse_routes
from gpuscope.keys import check_keys

ALERTING_KEYS = {
    "state_path",
    "external_url",
    "pending",
    "flap",
    "silences",
    "maintenance",
    "escalation",
    "outbox",
}


@dataclass(slots=True)
class AlertingSettings:
    notifiers: dict[str, Notifier] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)
    state_path: str | None = None
    external_url: str = ""
    pending_for: dict[str, float] = field(default_factory=dict)
    flap_threshold: int = 4
    flap_window: float = 900.0
    silences: Any = None  # raw list, turned into silences at start-up (they need the clock)
    windows: list[MaintenanceWindow] = field(default_factory=list)
    escalation: list[EscalationLevel] = field(default_factory=list)
    base_backoff: float = 1.0
    max_backoff: float = 30.0
    max_age: float = 86400.0


def parse_receivers(raw: Any) -> dict[str, Notifier]:
    """``receivers``: each a name and exactly one notifier kind with its settings."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ValueError("receivers: must be a list")
    kinds = load_notifiers()
    out: dict[str, Notifier] = {}
    for i, item in enumerate(raw):
        where = f"receivers[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"{where}: must be a mapping with a name")
        name = item["name"]
        if name in out:
            raise ValueError(f"{where}: receiver {name!r} is defined twice")
        present = [k for k in item if k != "name"]
        if len(present) != 1 or present[0] not in kinds:
            raise ValueError(
                f"{where} ({name}): needs exactly one of {', '.join(sorted(kinds))}, got {present or 'none'}"
            )
        settings = item[present[0]]
        if not isinstance(settings, dict):
            raise ValueError(f"{where}.{present[0]}: must be a mapping")
        check_keys(settings, f"{where}.{present[0]}", kinds[present[0]].keys)
        out[name] = kinds[present[0]](name, settings)
    return out


def parse_alerting(raw: dict[str, Any]) -> AlertingSettings:
    """The whole alerting configuration from the config file's raw mapping."""
    s = AlertingSettings()
    s.notifiers = parse_receivers(raw.get("receivers"))
    if raw.get("routes") is not None and not s.notifiers:
        raise ValueError("routes: there are routes but no receivers")
    s.routes = parse_routes(raw.get("routes"), set(s.notifiers))
    section = raw.get("alerting") or {}
    if not isinstance(section, dict):
        raise ValueError("alerting: must be a mapping")
    check_keys(section, "alerting", ALERTING_KEYS)
    if "state_path" in section:
        s.state_path = str(section["state_path"])
    s.external_url = str(section.get("external_url", "")).rstrip("/")
    pending = section.get("pending") or {}
    if not isinstance(pending, dict):
        raise ValueError("alerting.pending: must be a mapping of rule: duration")
    s.pending_for = check_pending(
        {str(k): parse_duration(v, f"alerting.pending.{k}") for k, v in pending.items()}, "alerting.pending"
    )
    flap = section.get("flap") or {}
    if not isinstance(flap, dict):
        raise ValueError("alerting.flap: must be a mapping")
    check_keys(flap, "alerting.flap", {"threshold", "window"})
    threshold = flap.get("threshold", s.flap_threshold)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 2:
        raise ValueError("alerting.flap.threshold: must be an integer of at least 2")
    s.flap_threshold = threshold
    s.flap_window = parse_duration(flap.get("window", s.flap_window), "alerting.flap.window")
    s.silences = section.get("silences")
    s.windows = parse_windows(section.get("maintenance"))
    s.escalation = parse_escalation(section.get("escalation"), set(s.notifiers))
    outbox = section.get("outbox") or {}
    if not isinstance(outbox, dict):
        raise ValueError("alerting.outbox: must be a mapping")
    check_keys(outbox, "alerting.outbox", {"base_backoff", "max_backoff", "max_age"})
    s.base_backoff = parse_duration(
        outbox.get("base_backoff", s.base_backoff), "alerting.outbox.base_backoff"
    )
    s.max_backoff = parse_duration(outbox.get("max_backoff", s.max_backoff), "alerting.outbox.max_backoff")
    s.max_age = parse_duration(outbox.get("max_age", s.max_age), "alerting.outbox.max_age")
    if not 0 < s.base_backoff <= s.max_backoff or s.max_age <= 0:
        raise ValueError("alerting.outbox: need 0 < base_backoff <= max_backoff and max_age > 0")
    return s
