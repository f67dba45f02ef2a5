"""The services pages' data: each inference service's latest figures, versions and drift alerts.

Drift scores come from the drift rules' alerts (their value is the score that crossed the
threshold), so a service without such alerts shows none.
"""

from __future__ import annotations

from typing import Any

from gpuscope.hub import Hub
from gpuscope.rules import rules_of
from gpuscope.signals import SERVICE_METRICS
from gpuscope.web.dashboard.common import AlertIndex, alert_brief, finite, natural_key, worst

DRIFT_RULES = rules_of("quality")
VERSION_EVENTS = ("model_version_registered", "model_version_promoted")
LOOKBACK_SECONDS = 30 * 86400.0


def services_view(hub: Hub) -> dict[str, Any]:
    """One row per service: its model and version now, latest figures, and firing alerts."""
    index = AlertIndex(hub.firing())
    by_service: dict[str, dict[str, Any]] = {}
    for row in hub.store.snapshot(list(SERVICE_METRICS), None):
        labels = row["labels"]
        name = labels.get("service")
        if not name:
            continue
        entry = by_service.setdefault(
            name, {"service": name, "model": labels.get("model"), "versions": [], "nodes": [], "values": {}}
        )
        for key, bucket in (("version", "versions"), ("node", "nodes")):
            if labels.get(key) and labels[key] not in entry[bucket]:
                entry[bucket].append(labels[key])
        if row["ts"] >= entry.get("ts", 0.0):
            entry["ts"] = row["ts"]
            entry["values"] = {k: finite(v) for k, v in row["values"].items()}
    out = []
    for name in sorted(by_service, key=natural_key):
        alerts = index.by_service.get(name, [])
        out.append({**by_service[name], "alerts": len(alerts), "worst": worst(a.severity for a in alerts)})
    return {"services": out}


def service_view(hub: Hub, service: str, now: float) -> dict[str, Any]:
    """A service's version timeline, drift scores and alerts; its charts use ``/api/v1/series``."""
    listing = {s["service"]: s for s in services_view(hub)["services"]}
    if service not in listing:
        raise KeyError(service)
    info = listing[service]
    events = []
    for kind in VERSION_EVENTS:
        events += hub.store.events(now - LOOKBACK_SECONDS, now, kind, None, 10_000)
    mine = [
        e
        for e in sorted(events, key=lambda e: e.ts)
        if e.labels.get("service") == service
        or e.data.get("service") == service
        or (info.get("model") and (e.data.get("model") or e.labels.get("model")) == info["model"])
    ]
    history = [a for a in hub.stored_alerts(False, 5000) if a.entity.get("service") == service]
    drift = [
        {"rule": a.rule, "score": finite(a.value), "started_at": a.started_at, "firing": a.firing, "id": a.id}
        for a in history
        if a.rule in DRIFT_RULES
    ]
    return {
        **info,
        "versions_timeline": [{"ts": e.ts, "kind": e.kind, "labels": e.labels, "data": e.data} for e in mine],
        "drift": drift,
        "alerts": [alert_brief(a) for a in sorted(history, key=lambda a: -a.started_at)[:100]],
    }
