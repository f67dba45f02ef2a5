"""``gpuscope config check FILE``: every section of a config file parsed as the hub would, nothing opened.

The hub parses most sections in :func:`gpuscope.config.load_config` and the alerting ones (receivers,
routes, alerting, slos) when it attaches its services; this runs all of those parsers without
opening a store, a database or a port, so a file can be checked before a hub is restarted with it.
"""

from __future__ import annotations

import os
import time

from gpuscope.alert.silences import parse_config_silences
from gpuscope.config import ConfigError, HubConfig, load_config
from gpuscope.quality.slo import Slo


def parse_slos(cfg: HubConfig) -> list[Slo]:
    """The ``slos:`` section, parsed once by :func:`gpuscope.config.load_config`."""
    return cfg.slos


def check_config(path: str | os.PathLike[str]) -> list[str]:
    """Parse every section of ``path``; a summary line per section, or ConfigError naming the key."""
    cfg = load_config(path)
    alerting = cfg.alerting
    try:
        silences = parse_config_silences(alerting.silences, time.time())
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    slos = parse_slos(cfg)
    auth = cfg.auth
    where = cfg.storage.path if cfg.storage.backend == "duckdb" else cfg.storage.query_url
    reads = "need a token" if auth.require_read_token else "open on loopback"
    return [
        f"listen {cfg.host}:{cfg.port}" + (" (TLS)" if cfg.tls else ""),
        f"storage {cfg.storage.backend} ({where})",
        f"auth {len(auth.tokens)} token(s), reads {reads}",
        f"receivers {', '.join(sorted(alerting.notifiers)) or 'none'}; {len(alerting.routes)} route(s)",
        f"alerting {len(silences)} silence(s), {len(alerting.windows)} maintenance window(s), "
        f"{len(alerting.escalation)} escalation level(s)",
        f"slos {len(slos)}",
        f"pricing {cfg.price_per_gpu_hour:g} per GPU-hour; raw retention {cfg.raw_retention_s:g} s",
    ]
