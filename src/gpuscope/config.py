"""The one YAML file a user configures (``--config FILE`` or ``GPUSCOPE_CONFIG``; DESIGN §5).

Only the keys this version understands are read; an unknown top-level key or a value of the wrong
type is refused with a message naming it, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuscope.alert.settings import AlertingSettings, parse_alerting
from gpuscope.cluster.config import ClusterConfig, parse_cluster
from gpuscope.detect.settings import FINISHED_JOB_RETENTION_S, WARMUP_S, parse_detection
from gpuscope.keys import unknown_key
from gpuscope.quality.slo import Slo, slos_from_config
from gpuscope.store.settings import StorageSettings, StoreLimits, parse_storage
from gpuscope.tls import TlsSettings, parse_tls
from gpuscope.web.auth import AuthSettings, Token, digest, parse_auth

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7470

KNOWN_KEYS = {"listen", "storage", "state", "auth", "pricing", "limits", "receivers", "routes", "retention"}
KNOWN_KEYS |= {"alerting"}  # silences, maintenance, escalation, pending, outbox: gpuscope.alert.settings
KNOWN_KEYS |= {"slos"}  # per-service objectives for error-budget burn rates: gpuscope.quality.slo
KNOWN_KEYS |= {"tls"}  # certificate files of the hub: gpuscope.tls
KNOWN_KEYS |= {"cluster"}  # sharded hubs sharing state in PostgreSQL: gpuscope.cluster.config
KNOWN_KEYS |= {"detection"}  # warmup_s: stored history replayed to the detectors at start/takeover
KNOWN_KEYS |= {"hub"}  # ingest_workers: processes taking the ingest front: gpuscope.web.ingest_workers


class ConfigError(ValueError):
    """The configuration file is unusable; the message names the key. Each section's parser raises
    its own ``ValueError`` subclass (naming the key); :func:`load_config` turns it into this one."""


@dataclass(slots=True)
class HubConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    storage_backend: str = "duckdb"
    storage_path: str = "gpuscope.duckdb"
    storage: StorageSettings = field(default_factory=StorageSettings)  # the whole storage: section
    tokens: list[str] = field(default_factory=list, repr=False)  # plain ones; every token is in auth
    auth: AuthSettings = field(default_factory=AuthSettings, repr=False)
    tls: TlsSettings | None = None
    price_per_gpu_hour: float = 2.5
    max_body_bytes: int = 64 * 1024 * 1024
    max_entities: int = 100_000
    max_metrics: int = 512
    #: glibc malloc arenas of the hub process (0: glibc's default, 8 per core)
    malloc_arenas: int = 2
    raw_retention_s: float = 7 * 86400
    warmup_s: float = WARMUP_S
    #: how long the detectors and the productivity model keep an ended job's state
    finished_job_retention_s: float = FINISHED_JOB_RETENTION_S
    #: processes serving the ingest route beside the hub's (0: the hub's own process serves it)
    ingest_workers: int = 0
    #: receivers, routes and the alerting: section (the notifiers hold receivers' URLs and keys)
    alerting: AlertingSettings = field(default_factory=AlertingSettings, repr=False)
    slos: list[Slo] = field(default_factory=list)
    cluster: ClusterConfig | None = field(default=None, repr=False)  # cluster: and state: (a DSN)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # for log redaction: every secret

    def storage_settings(self) -> StorageSettings:
        """The ``storage:`` section with the store path in force (``--db`` overrides the file)."""
        return replace(self.storage, path=self.storage_path)

    def store_limits(self) -> StoreLimits:
        return StoreLimits(self.max_entities, self.max_metrics, self.raw_retention_s)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) into its parts."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"listen: {value!r} is not HOST:PORT")
    return (host.strip("[]") or DEFAULT_HOST), int(port)


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping")
    return value


def _known(section: dict[str, Any], where: str, keys: frozenset[str]) -> dict[str, Any]:
    """``section`` itself, once none of its keys is a typo."""
    message = unknown_key(section, where, keys)
    if message is not None:
        raise ConfigError(message)
    return section


PRICING_KEYS = frozenset({"price_per_gpu_hour"})
LIMITS_KEYS = frozenset({"max_body_bytes", "max_entities", "max_metrics", "malloc_arenas"})
RETENTION_KEYS = frozenset({"raw_seconds"})
DETECTION_KEYS = frozenset({"warmup_s", "finished_job_retention_s"})
HUB_KEYS = frozenset({"ingest_workers"})
#: more ingest workers than this is a typo: each is a process with its own log and connections
MAX_INGEST_WORKERS = 64


def parse_ingest_workers(value: object) -> int:
    """``hub.ingest_workers``: a whole number from 0 (the hub's own process serves ingest) to
    :data:`MAX_INGEST_WORKERS`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INGEST_WORKERS:
        raise ConfigError(
            f"hub.ingest_workers: must be a whole number from 0 to {MAX_INGEST_WORKERS}, got {value!r}"
        )
    return value


def _number(section: dict[str, Any], key: str, where: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ConfigError(f"{where}.{key}: must be a non-negative number")
    return float(value)


def load_config(path: str | os.PathLike[str] | None = None, *, listen: str | None = None) -> HubConfig:
    """Read the config file named, or ``$GPUSCOPE_CONFIG``, or return the defaults. ``listen``
    (``--listen``) overrides the file's ``listen:`` before the sections that depend on it."""
    path = path or os.environ.get("GPUSCOPE_CONFIG")
    cfg = HubConfig()
    env_token = os.environ.get("GPUSCOPE_TOKEN")
    if env_token:
        cfg.tokens.append(env_token)
    cfg.auth = parse_auth({}, env_token)
    raw = _read(path) if path else {}
    cfg.raw = raw
    try:
        if "listen" in raw:
            cfg.host, cfg.port = parse_listen(str(raw["listen"]))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if listen:
        cfg.host, cfg.port = parse_listen(listen)  # --listen: no file to name
    try:
        _parse_sections(cfg, raw, env_token)
    except ValueError as exc:  # each section's own error (or a ConfigError), naming its key
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None
    return cfg


def _read(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:  # its own text names "<unicode string>", not the file
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # scalars the resolver accepts but cannot build (0b_)
        raise ConfigError(f"{path}: not valid YAML: {exc or 'nested too deeply'}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping of sections")
    unknown = set(raw) - KNOWN_KEYS
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {sorted(unknown, key=str)[0]!r} (known: {', '.join(sorted(KNOWN_KEYS))})"
        )
    return raw


def _parse_sections(cfg: HubConfig, raw: dict[str, Any], env_token: str | None) -> None:
    """Every section, once, into its typed field of ``cfg``."""
    cfg.storage = parse_storage(_section(raw, "storage"))
    cfg.storage_backend, cfg.storage_path = cfg.storage.backend, cfg.storage.path
    auth = _section(raw, "auth")
    cfg.auth = parse_auth(auth, env_token)  # token entries, scopes, rate limits, audit log
    cfg.tls = parse_tls(_section(raw, "tls"))
    cfg.tokens.extend(t for t in auth.get("tokens") or [] if isinstance(t, str))
    pricing = _known(_section(raw, "pricing"), "pricing", PRICING_KEYS)
    cfg.price_per_gpu_hour = _number(pricing, "price_per_gpu_hour", "pricing", cfg.price_per_gpu_hour)
    limits = _known(_section(raw, "limits"), "limits", LIMITS_KEYS)
    cfg.max_body_bytes = int(_number(limits, "max_body_bytes", "limits", cfg.max_body_bytes))
    cfg.max_entities = int(_number(limits, "max_entities", "limits", cfg.max_entities))
    cfg.max_metrics = int(_number(limits, "max_metrics", "limits", cfg.max_metrics))
    arenas = limits.get("malloc_arenas", cfg.malloc_arenas)
    if isinstance(arenas, bool) or not isinstance(arenas, int) or not 0 <= arenas <= 1024:
        raise ConfigError("limits.malloc_arenas: must be a whole number from 0 to 1024")
    cfg.malloc_arenas = arenas
    retention = _known(_section(raw, "retention"), "retention", RETENTION_KEYS)
    cfg.raw_retention_s = _number(retention, "raw_seconds", "retention", cfg.raw_retention_s)
    detection = parse_detection(_known(_section(raw, "detection"), "detection", DETECTION_KEYS))
    cfg.warmup_s, cfg.finished_job_retention_s = detection.warmup_s, detection.finished_job_retention_s
    hub = _known(_section(raw, "hub"), "hub", HUB_KEYS)
    cfg.ingest_workers = parse_ingest_workers(hub.get("ingest_workers", cfg.ingest_workers))
    cfg.alerting = parse_alerting(raw)  # receivers, routes and alerting:
    cfg.slos = slos_from_config(raw.get("slos"))
    cfg.cluster = parse_cluster(raw, cfg.host, cfg.port)
    if cfg.cluster is not None and cfg.auth.tokens:
        # hubs forward batches to each other with the peer token: it may ingest, nothing more
        cfg.auth.tokens.append(Token("cluster-peer", frozenset({"ingest"}), digest(cfg.cluster.peer_token)))
