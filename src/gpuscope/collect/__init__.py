"""Collectors: one module per telemetry source, each registering itself (see ``base``)."""

from gpuscope.collect.base import (
    COLLECTORS,
    Collected,
    Collector,
    CollectorContext,
    CollectorError,
    CollectorSet,
    build_collectors,
    enabled_collectors,
    load_collectors,
    register_collector,
)

__all__ = [
    "COLLECTORS",
    "Collected",
    "Collector",
    "CollectorContext",
    "CollectorError",
    "CollectorSet",
    "build_collectors",
    "enabled_collectors",
    "load_collectors",
    "register_collector",
]
