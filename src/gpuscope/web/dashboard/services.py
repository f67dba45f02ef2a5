"""The services pages' data: each inference service's latest figures, versions and drift alerts.

Drift scores come from the drift rules' alerts (their value is the score that crossed the
threshold), so a service without such alerts shows none.

The version a service serves now is the one its latest ``model_version_promoted`` event names
(a rollout, a rollback, or a promotion through the lineage API), the event ``version_regression``
blames; without one, the version on the service's newest report. The versions its fresh reports
name are kept beside it, so a promotion the serving fleet has not picked up shows as such.
"""

from __future__ import annotations

from typing import Any

from gpuscope.hub import Hub
from gpuscope.model import Event
from gpuscope.rules import rules_of
from gpuscope.signals import SERVICE_METRICS
from gpuscope.web.dashboard.common import AlertIndex, alert_brief, finite, natural_key, worst

DRIFT_RULES = rules_of("quality")
VERSION_EVENTS = ("model_version_registered", "model_version_promoted")
LOOKBACK_SECONDS = 30 * 86400.0
#: a report older than this, behind the service's newest, no longer says what serves
FRESH_SECONDS = 15.0


def services_view(hub: Hub, now: float) -> dict[str, Any]:
    """One row per service: its model and version now, latest figures, and firing alerts."""
    index = AlertIndex(hub.firing())
    by_service: dict[str, dict[str, Any]] = {}
    seen: dict[str, dict[str, float]] = {}  # service -> version -> newest report naming it
    for row in hub.store.snapshot(list(SERVICE_METRICS), None):
        labels = row["labels"]
        name = labels.get("service")
        if not name:
            continue
        entry = by_service.setdefault(
            name, {"service": name, "model": labels.get("model"), "nodes": [], "values": {}}
        )
        if labels.get("node") and labels["node"] not in entry["nodes"]:
            entry["nodes"].append(labels["node"])
        if labels.get("version"):
            versions = seen.setdefault(name, {})
            versions[labels["version"]] = max(versions.get(labels["version"], 0.0), row["ts"])
        if row["ts"] >= entry.get("ts", 0.0):
            entry["ts"] = row["ts"]
            entry["values"] = {k: finite(v) for k, v in row["values"].items()}
    promoted = latest_promotions(hub, now)
    out = []
    for name in sorted(by_service, key=natural_key):
        entry = by_service[name]
        by_age = sorted(seen.get(name, {}).items(), key=lambda kv: -kv[1])
        # newest first: the version on the newest report leads
        entry["versions"] = [v for v, _ in by_age]
        entry["serving"] = serving(promoted.get(name), by_age, entry["ts"])
        alerts = index.by_service.get(name, [])
        out.append({**entry, "alerts": len(alerts), "worst": worst(a.severity for a in alerts)})
    return {"services": out}


def latest_promotions(hub: Hub, now: float) -> dict[str, Event]:
    """Each service's newest ``model_version_promoted`` event within the lookback."""
    out: dict[str, Event] = {}
    for event in hub.store.events(now - LOOKBACK_SECONDS, now, "model_version_promoted", None, 10_000):
        name = event.labels.get("service") or event.data.get("service")
        if isinstance(name, str) and name and (name not in out or event.ts >= out[name].ts):
            out[name] = event
    return out


def serving(promotion: Event | None, reported: list[tuple[str, float]], newest: float) -> dict[str, Any]:
    """What serves now: the latest promotion's version, else the newest report's; with the
    versions the service's fresh reports name (``reported``: version and newest report, newest
    first)."""
    fresh = [v for v, ts in reported if newest - ts <= FRESH_SECONDS]
    if promotion is not None:
        version = promotion.labels.get("version") or promotion.data.get("version")
        share = promotion.data.get("traffic_share")
        return {
            "version": str(version) if version else None,
            "source": "promotion",
            "since": promotion.ts,
            "traffic_share": finite(share) if isinstance(share, int | float) else None,
            "reported": fresh,
        }
    return {
        "version": fresh[0] if fresh else None,
        "source": "reports",
        "since": None,
        "traffic_share": None,
        "reported": fresh,
    }


def service_view(hub: Hub, service: str, now: float) -> dict[str, Any]:
    """A service's version timeline, drift scores and alerts; its charts use ``/api/v1/series``."""
    listing = {s["service"]: s for s in services_view(hub, now)["services"]}
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
