"""The ``storage:`` section of the config file, and the one place a store is built from it.

```yaml
storage:
  backend: duckdb            # or prometheus: any Prometheus-compatible remote-write + PromQL TSDB
  path: gpuscope.duckdb      # duckdb: the store; prometheus: the local meta store (meta: duckdb)
  remote_write_url: http://127.0.0.1:8428/api/v1/write
  query_url: http://127.0.0.1:8428           # base of the PromQL HTTP API
  headers: {X-Scope-OrgID: team-a}           # e.g. a Mimir tenant; sent on writes and queries
  bearer_token_file: /run/secrets/tsdb-token # or basic_auth: {username: u, password_file: /run/...}
  timeout_s: 10                              # per request
  retry_s: 30                                # 5xx / connection errors retried this long, then 503
  meta: duckdb                               # or postgres: events, training, alerts, batch ids
  postgres_dsn: postgresql://hub@db/gpuscope # shared by several hubs
  flush_interval_s: 5                        # duckdb: acknowledged rows reach the tables this often
  memory_limit: 256MB                        # duckdb: the most its buffer pool and queries may hold
  cache_limit: 16MB                          # duckdb: cached table blocks kept after each upkeep
  seal_interval_s: 60                        # duckdb: hot rows are sealed into Parquet this often
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscope.store.base import Store
from gpuscope.store.memory_size import DEFAULT_CACHE_LIMIT, DEFAULT_MEMORY_LIMIT, MEMORY_SIZE
from gpuscope.store.sealing import DEFAULT_SEAL_INTERVAL_S, seal_interval_error

METAS = ("duckdb", "postgres")
KEYS = {
    "backend",
    "path",
    "remote_write_url",
    "query_url",
    "headers",
    "bearer_token_file",
    "basic_auth",
    "timeout_s",
    "retry_s",
    "meta",
    "postgres_dsn",
    "flush_interval_s",
    "memory_limit",
    "cache_limit",
    "seal_interval_s",
}


class StorageConfigError(ValueError):
    """A bad ``storage:`` value; the message names the key."""


@dataclass(slots=True)
class StorageSettings:
    backend: str = "duckdb"
    path: str = "gpuscope.duckdb"
    remote_write_url: str | None = None
    query_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may carry credentials
    bearer_token_file: str | None = None
    basic_auth: tuple[str, str] | None = None  # (username, password file)
    timeout_s: float = 10.0
    retry_s: float = 30.0
    meta: str = "duckdb"
    postgres_dsn: str | None = field(default=None, repr=False)  # may carry a password
    flush_interval_s: float = 5.0
    memory_limit: str = DEFAULT_MEMORY_LIMIT
    cache_limit: str = DEFAULT_CACHE_LIMIT
    seal_interval_s: float = DEFAULT_SEAL_INTERVAL_S


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Bounds a store enforces (the config's ``limits:`` and ``retention:``)."""

    max_entities: int = 100_000
    max_metrics: int = 512
    raw_retention_s: float = 7 * 86400.0


def _str(section: dict[str, Any], key: str) -> str | None:
    value = section.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise StorageConfigError(f"storage.{key}: must be a non-empty string")
    return value


def _url(section: dict[str, Any], key: str) -> str | None:
    value = _str(section, key)
    if value is not None and not value.startswith(("http://", "https://")):
        raise StorageConfigError(f"storage.{key}: must be an http:// or https:// URL, got {value!r}")
    return value


def _seconds(section: dict[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise StorageConfigError(f"storage.{key}: must be a positive number of seconds")
    return float(value)


def parse_storage(section: dict[str, Any]) -> StorageSettings:
    """Check every key of ``storage:``; unknown keys and wrong types are refused by name."""
    unknown = sorted(set(section) - KEYS)
    if unknown:
        raise StorageConfigError(f"storage.{unknown[0]}: unknown key (known: {', '.join(sorted(KEYS))})")
    s = StorageSettings()
    s.backend = _str(section, "backend") or s.backend
    if s.backend not in BACKENDS:
        raise StorageConfigError(f"storage.backend: {s.backend!r} is not one of {', '.join(BACKENDS)}")
    s.path = _str(section, "path") or s.path
    s.remote_write_url = _url(section, "remote_write_url")
    s.query_url = _url(section, "query_url")
    headers = section.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise StorageConfigError("storage.headers: must be a mapping of header names to strings")
    s.headers = dict(headers)
    s.bearer_token_file = _str(section, "bearer_token_file")
    auth = section.get("basic_auth")
    if auth is not None:
        if not isinstance(auth, dict) or set(auth) != {"username", "password_file"}:
            raise StorageConfigError("storage.basic_auth: must be {username: ..., password_file: ...}")
        user, pw = _str(auth, "username"), _str(auth, "password_file")
        assert user is not None and pw is not None
        s.basic_auth = (user, pw)
    if s.bearer_token_file and s.basic_auth:
        raise StorageConfigError("storage.basic_auth: give either bearer_token_file or basic_auth")
    s.timeout_s = _seconds(section, "timeout_s", s.timeout_s)
    s.retry_s = _seconds(section, "retry_s", s.retry_s)
    s.flush_interval_s = _seconds(section, "flush_interval_s", s.flush_interval_s)
    s.memory_limit = _str(section, "memory_limit") or s.memory_limit
    if not MEMORY_SIZE.fullmatch(s.memory_limit):
        raise StorageConfigError(f"storage.memory_limit: {s.memory_limit!r} is not a size such as '512MB'")
    s.cache_limit = _str(section, "cache_limit") or s.cache_limit
    if not MEMORY_SIZE.fullmatch(s.cache_limit):
        raise StorageConfigError(f"storage.cache_limit: {s.cache_limit!r} is not a size such as '32MB'")
    s.seal_interval_s = _seconds(section, "seal_interval_s", s.seal_interval_s)
    why = seal_interval_error(s.seal_interval_s)
    if why is not None:
        raise StorageConfigError(f"storage.seal_interval_s: {why}")
    s.meta = _str(section, "meta") or s.meta
    if s.meta not in METAS:
        raise StorageConfigError(f"storage.meta: {s.meta!r} is not one of {', '.join(METAS)}")
    s.postgres_dsn = _str(section, "postgres_dsn")
    if s.meta == "postgres" and not s.postgres_dsn:
        raise StorageConfigError("storage.postgres_dsn: required with meta: postgres")
    if s.backend == "prometheus":
        for key in ("remote_write_url", "query_url"):
            if getattr(s, key) is None:
                raise StorageConfigError(f"storage.{key}: required with backend: prometheus")
    return s


def _secret(path: str, key: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise StorageConfigError(f"storage.{key}: cannot read {path}: {exc.strerror}") from None


def _duckdb(s: StorageSettings, limits: StoreLimits) -> Store:
    from gpuscope.store.duckdb import DuckDBStore  # the backend's modules load when chosen

    return DuckDBStore(
        s.path,
        max_entities=limits.max_entities,
        max_metrics=limits.max_metrics,
        raw_retention_s=limits.raw_retention_s,
        flush_interval_s=s.flush_interval_s,
        memory_limit=s.memory_limit,
        cache_limit=s.cache_limit,
        seal_interval_s=s.seal_interval_s,
    )


def _prometheus(s: StorageSettings, limits: StoreLimits) -> Store:
    from gpuscope.store.duckdb import DuckDBStore
    from gpuscope.store.remote.meta import MetaStore, PostgresMeta
    from gpuscope.store.remote.prom_store import PromStore

    headers = dict(s.headers)
    if s.bearer_token_file:
        headers["Authorization"] = f"Bearer {_secret(s.bearer_token_file, 'bearer_token_file')}"
    auth = (s.basic_auth[0], _secret(s.basic_auth[1], "basic_auth")) if s.basic_auth else None
    meta: MetaStore
    if s.meta == "postgres":
        assert s.postgres_dsn is not None
        meta = PostgresMeta(s.postgres_dsn, max_metrics=limits.max_metrics)
    else:
        meta = DuckDBStore(
            s.path, max_metrics=limits.max_metrics, memory_limit=s.memory_limit, cache_limit=s.cache_limit
        )
    assert s.remote_write_url is not None and s.query_url is not None
    return PromStore(
        s.remote_write_url,
        s.query_url,
        meta,
        headers=headers,
        auth=auth,
        timeout_s=s.timeout_s,
        retry_s=s.retry_s,
        max_entities=limits.max_entities,
        max_metrics=limits.max_metrics,
        path=s.path,
    )


#: ``storage.backend`` -> how that store is built; a new backend is one entry here
BACKENDS: dict[str, Callable[[StorageSettings, StoreLimits], Store]] = {
    "duckdb": _duckdb,
    "prometheus": _prometheus,
}


def open_store(s: StorageSettings, limits: StoreLimits | None = None) -> Store:
    """The store ``s`` describes: embedded DuckDB (default) or a remote TSDB with its meta store."""
    return BACKENDS[s.backend](s, limits or StoreLimits())


def store_label(s: StorageSettings) -> str:
    """Where telemetry goes, for start-up lines (no credentials)."""
    if s.backend == "duckdb":
        return s.path
    from gpuscope.store.remote.prom_store import redact

    assert s.remote_write_url is not None
    meta = "postgres" if s.meta == "postgres" else s.path
    return f"prometheus remote-write {redact(s.remote_write_url)}, meta {meta}"
