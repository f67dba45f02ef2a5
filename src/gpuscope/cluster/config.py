"""The ``cluster:`` section of the config file: sharded hubs sharing state in PostgreSQL.

```yaml
cluster:
  postgres_dsn: postgresql://gpuscope@db.internal/gpuscope   # required (or state.postgres_dsn)
  hub_id: hub-a                     # default: hostname:port
  advertise_url: http://10.0.0.5:7470   # how peers reach this hub (default: http://listen)
  shards: 256                       # fixed for the life of a cluster: every hub must agree
  lease_s: 5                        # a member whose lease is older is dead
  peer_token: "a-long-random-secret"   # hubs forwarding data to each other (>= 16 characters)
  forward_queue: 1000               # batches queued per peer before drops are counted
```

``state: {postgres_dsn: ...}`` (the key DESIGN §5 names for the shared state of sharded hubs) means
the same as ``cluster.postgres_dsn``, and alone makes the hub a cluster member with the defaults
above (it still needs ``cluster.peer_token``). Giving both with different values is an error.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any


class ClusterConfigError(ValueError):
    """A bad ``cluster:`` or ``state:`` value; the message names the key."""


KNOWN = {"postgres_dsn", "hub_id", "advertise_url", "shards", "lease_s", "peer_token", "forward_queue"}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    postgres_dsn: str
    hub_id: str
    advertise_url: str
    peer_token: str
    shards: int = 256
    lease_s: float = 5.0
    forward_queue: int = 1000

    @property
    def renew_s(self) -> float:
        """How often the lease is renewed and membership re-read: five times per lease."""
        return self.lease_s / 5


def _int(section: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ClusterConfigError(f"cluster.{key}: must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _text(section: dict[str, Any], key: str, default: str | None, min_len: int = 1) -> str:
    value = section.get(key, default)
    if not isinstance(value, str) or len(value) < min_len:
        need = "is required" if value is None else f"must be a string of at least {min_len} characters"
        raise ClusterConfigError(f"cluster.{key}: {need}")
    return value


def _state_dsn(raw: dict[str, Any]) -> str | None:
    """``state.postgres_dsn``, checked (None when the config has no ``state:`` section)."""
    state = raw.get("state")
    if state is None:
        return None
    if not isinstance(state, dict):
        raise ClusterConfigError("state: must be a mapping")
    unknown = set(state) - {"postgres_dsn"}
    if unknown:
        raise ClusterConfigError(f"state.{sorted(unknown)[0]}: unknown key (known: postgres_dsn)")
    dsn = state.get("postgres_dsn")
    if not isinstance(dsn, str) or not dsn:
        raise ClusterConfigError("state.postgres_dsn: is required (a postgresql:// URL) in a state: section")
    return dsn


def parse_cluster(raw: dict[str, Any], host: str, port: int) -> ClusterConfig | None:
    """The cluster settings of a config file, or None when it has neither a ``cluster:`` section
    nor ``state.postgres_dsn``."""
    section = raw.get("cluster")
    state_dsn = _state_dsn(raw)
    if section is None and state_dsn is None:
        return None
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ClusterConfigError("cluster: must be a mapping")
    unknown = set(section) - KNOWN
    if unknown:
        raise ClusterConfigError(
            f"cluster.{sorted(unknown)[0]}: unknown key (known: {', '.join(sorted(KNOWN))})"
        )
    if state_dsn is not None and section.get("postgres_dsn", state_dsn) != state_dsn:
        raise ClusterConfigError(
            "cluster.postgres_dsn: differs from state.postgres_dsn (one database; give it once)"
        )
    dsn = _text({"postgres_dsn": state_dsn, **section}, "postgres_dsn", None)
    if not dsn.startswith(("postgresql://", "postgres://")) and "=" not in dsn:
        raise ClusterConfigError(
            "cluster.postgres_dsn: must be a postgresql:// URL or a libpq key=value string"
        )
    lease = section.get("lease_s", 5.0)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 1 <= lease <= 300:
        raise ClusterConfigError(f"cluster.lease_s: must be a number of seconds in 1..300, got {lease!r}")
    url_host = f"[{host}]" if ":" in host else host
    advertise = _text(section, "advertise_url", f"http://{url_host}:{port}")
    if not advertise.startswith(("http://", "https://")):
        raise ClusterConfigError(f"cluster.advertise_url: must be an http(s) URL, got {advertise!r}")
    return ClusterConfig(
        postgres_dsn=dsn,
        hub_id=_text(section, "hub_id", f"{socket.gethostname()}:{port}"),
        advertise_url=advertise.rstrip("/"),
        peer_token=_text(section, "peer_token", None, 16),
        shards=_int(section, "shards", 256, 1, 16384),
        lease_s=float(lease),
        forward_queue=_int(section, "forward_queue", 1000, 1, 1_000_000),
    )
