"""The services a running hub carries beside ingest and detection, attached in one place.

``gpuscope hub`` and ``gpuscope demo`` both call :func:`attach_services`, so the demo shows what a
real deployment does: notifications and triage (alerting), and model quality with error budgets.
"""

from __future__ import annotations

from gpuscope.alert.service import AlertingService, attach_alerting
from gpuscope.config import HubConfig
from gpuscope.config_check import parse_slos
from gpuscope.hub import Hub
from gpuscope.quality.monitor import QualityMonitor


def attach_services(hub: Hub, cfg: HubConfig) -> AlertingService:
    """Attach quality monitoring and alerting to ``hub``; the caller starts and stops alerting."""
    QualityMonitor(parse_slos(cfg)).attach(hub)
    return attach_alerting(hub, cfg)
