"""Who may do what on a hub: scoped tokens stored hashed, rate limits, and the audit log.

The ``auth:`` section of the config::

    auth:
      tokens:
        - {name: agents, scopes: [ingest], sha256: 9f86d0...}   # from `gpuscope token create`
        - {name: grafana, scopes: [read], token: a-plain-token-of-16+-chars}
        - a-legacy-plain-token                                    # a plain string: every scope
      require_read_token: false      # on loopback, reads are open unless this is true
      rate_limits:                   # token buckets: requests per second and burst
        ingest: {rate: 200, burst: 400}        # per token, for requests needing this scope
        read: {rate: 50, burst: 100}
        anonymous: {rate: 20, burst: 40}       # requests without a token (loopback reads)
        tokens: {agents: {rate: 1000, burst: 2000}}   # per token name, overrides its scope's
      audit_log: /var/lib/gpuscope/audit.jsonl       # default: beside the store

``GPUSCOPE_TOKEN`` is a plain token with every scope. Only SHA-256 digests are kept in memory and
compared, in constant time; a token itself is never logged, echoed or put in a ``repr``. This
module is the standard library only, so the config loader can import it cheaply.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import math
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

INGEST, READ, ADMIN = "ingest", "read", "admin"
SCOPES = (INGEST, READ, ADMIN)
ANONYMOUS = "anonymous"
MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class Token:
    """A known token: its name (what logs and the audit log show), its scopes, its digest."""

    name: str
    scopes: frozenset[str]
    sha256: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class RateLimit:
    rate: float  # requests per second, refilled continuously
    burst: float  # bucket size


@dataclass(slots=True)
class AuthSettings:
    tokens: list[Token] = field(default_factory=list)
    require_read_token: bool = False
    scope_limits: dict[str, RateLimit] = field(default_factory=dict)  # by scope, and "anonymous"
    token_limits: dict[str, RateLimit] = field(default_factory=dict)  # by token name
    audit_log: str | None = None

    @classmethod
    def from_plain(cls, tokens: Iterable[str]) -> AuthSettings:
        """Plain tokens, each with every scope (the pre-scope configuration)."""
        return cls([plain_token(t, f"token-{i + 1}") for i, t in enumerate(tokens)])

    def limit_for(self, name: str, scope: str) -> RateLimit | None:
        if name in self.token_limits:
            return self.token_limits[name]
        return self.scope_limits.get(ANONYMOUS if name == ANONYMOUS else scope)

    def match(self, presented: str) -> Token | None:
        """The token whose digest equals the presented one's; every entry is compared (constant time)."""
        d = digest(presented)
        found = None
        for t in self.tokens:
            if hmac.compare_digest(d, t.sha256):
                found = t
        return found


def plain_token(token: str, name: str) -> Token:
    return Token(name, frozenset(SCOPES), digest(token))


def _scopes(value: Any, where: str) -> frozenset[str]:
    if isinstance(value, str):
        value = [s.strip() for s in value.split(",") if s.strip()]
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: must be a non-empty list of {', '.join(SCOPES)}")
    bad = [s for s in value if s not in SCOPES]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r} is not a scope ({', '.join(SCOPES)})")
    return frozenset(value)


def _token_entry(entry: Any, i: int) -> Token:
    where = f"auth.tokens[{i}]"
    if isinstance(entry, str):
        if len(entry) < MIN_TOKEN_CHARS:
            raise ValueError(f"{where}: a token must have at least {MIN_TOKEN_CHARS} characters")
        return plain_token(entry, f"token-{i + 1}")
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a token string or a mapping {{name, scopes, sha256}}")
    unknown = set(entry) - {"name", "scopes", "sha256", "token"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (name, scopes, sha256, token)")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or name == ANONYMOUS:
        raise ValueError(f"{where}.name: 1 to 64 letters, digits, '_', '.', '-' (not 'anonymous')")
    scopes = _scopes(entry.get("scopes"), f"{where}.scopes")
    if ("sha256" in entry) == ("token" in entry):
        raise ValueError(f"{where}: give exactly one of sha256 (preferred) or token")
    if "sha256" in entry:
        hexed = str(entry["sha256"]).lower()
        if not _HEX64.match(hexed):
            raise ValueError(f"{where}.sha256: must be 64 hex digits")
        return Token(name, scopes, bytes.fromhex(hexed))
    plain = entry["token"]
    if not isinstance(plain, str) or len(plain) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}.token: must be a string of at least {MIN_TOKEN_CHARS} characters")
    return Token(name, scopes, digest(plain))


def _rate(value: Any, where: str) -> RateLimit:
    if not isinstance(value, dict) or set(value) - {"rate", "burst"} or "rate" not in value:
        raise ValueError(f"{where}: must be {{rate: REQUESTS_PER_SECOND, burst: N}}")
    rate: Any = value["rate"]
    burst: Any = value.get("burst", rate)
    for key, v in (("rate", rate), ("burst", burst)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{where}.{key}: must be a positive number")
    return RateLimit(float(rate), max(1.0, float(burst)))


def parse_auth(section: Mapping[str, Any], env_token: str | None = None) -> AuthSettings:
    """The ``auth:`` section (ValueError naming the key when it is wrong), plus ``GPUSCOPE_TOKEN``."""
    unknown = set(section) - {"tokens", "require_read_token", "rate_limits", "audit_log"}
    if unknown:
        raise ValueError(f"auth: unknown key {sorted(unknown)[0]!r}")
    settings = AuthSettings()
    if env_token:
        settings.tokens.append(plain_token(env_token, "env"))
    entries = section.get("tokens") or []
    if not isinstance(entries, list):
        raise ValueError("auth.tokens: must be a list")
    for i, entry in enumerate(entries):
        settings.tokens.append(_token_entry(entry, i))
    names = [t.name for t in settings.tokens]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"auth.tokens: the name {dupes[0]!r} is used twice")
    required = section.get("require_read_token", False)
    if not isinstance(required, bool):
        raise ValueError("auth.require_read_token: must be true or false")
    settings.require_read_token = required
    limits = section.get("rate_limits") or {}
    if not isinstance(limits, dict):
        raise ValueError("auth.rate_limits: must be a mapping")
    for key, value in limits.items():
        if key == "tokens":
            if not isinstance(value, dict):
                raise ValueError("auth.rate_limits.tokens: must map token names to limits")
            for name, v in value.items():
                if name not in names:
                    raise ValueError(f"auth.rate_limits.tokens.{name}: no token has this name")
                settings.token_limits[str(name)] = _rate(v, f"auth.rate_limits.tokens.{name}")
        elif key in (*SCOPES, ANONYMOUS):
            settings.scope_limits[key] = _rate(value, f"auth.rate_limits.{key}")
        else:
            raise ValueError(
                f"auth.rate_limits: unknown key {key!r} ({', '.join((*SCOPES, ANONYMOUS))}, tokens)"
            )
    audit = section.get("audit_log")
    if audit is not None and (not isinstance(audit, str) or not audit):
        raise ValueError("auth.audit_log: must be a file path")
    settings.audit_log = audit
    return settings


class RateLimiter:
    """Token buckets keyed by (token name, scope); thread-safe, refilled from a monotonic clock."""

    def __init__(self, settings: AuthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, name: str, scope: str) -> float:
        """0.0 when the request may go ahead, else the seconds until it could."""
        limit = self.settings.limit_for(name, scope)
        if limit is None:
            return 0.0
        key = (name, scope if name not in self.settings.token_limits else "*")
        now = self.clock()
        with self._lock:
            level, at = self._buckets.get(key, (limit.burst, now))
            level = min(limit.burst, level + (now - at) * limit.rate)
            if level >= 1.0:
                self._buckets[key] = (level - 1.0, now)
                return 0.0
            self._buckets[key] = (level, now)
            return (1.0 - level) / limit.rate


class AuditLog:
    """Admin actions, one JSON object a line, each fsynced before the action is answered.

    Without a path (tests, the demo) the log lives in memory only; either way the most recent
    ``keep`` entries are kept in memory for ``GET /api/v1/audit``.
    """

    def __init__(self, path: str | None = None, keep: int = 10_000) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        if path is not None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists():
                for line in p.read_bytes().splitlines()[-keep:]:
                    try:
                        self._recent.append(orjson.loads(line))
                    except orjson.JSONDecodeError:
                        continue  # a torn last line after a crash
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.close(fd)

    def append(self, entry: dict[str, Any]) -> None:
        line = orjson.dumps(entry) + b"\n"
        with self._lock:
            if self.path is not None:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._recent.append(entry)

    def entries(self, limit: int = 1000, since: float = 0.0) -> list[dict[str, Any]]:
        """Most recent first."""
        with self._lock:
            rows = [e for e in self._recent if float(e.get("ts", 0.0)) >= since]
        return rows[::-1][:limit]


def default_audit_path(storage_path: str) -> str | None:
    return None if storage_path == ":memory:" else str(Path(storage_path).with_suffix(".audit.jsonl"))


# -- `gpuscope token create` ------------------------------------------------------------------


def new_token() -> str:
    return "gs_" + secrets.token_urlsafe(32)


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="token_command", required=True)
    create = sub.add_parser("create", help="print a new random token once, and its config line")
    create.add_argument("--name", required=True, help="what logs and the audit log call its holder")
    create.add_argument(
        "--scopes", required=True, help="comma-separated: ingest (agents, SDKs), read (dashboards), admin"
    )


def run_token(args: argparse.Namespace) -> int:
    import sys

    plain = new_token()
    try:
        token = _token_entry({"name": args.name, "scopes": args.scopes, "token": plain}, 0)
    except ValueError as exc:
        print(f"gpuscope token: {str(exc).replace('auth.tokens[0].', '--')}", file=sys.stderr)
        return 2
    scopes = ", ".join(s for s in SCOPES if s in token.scopes)
    print(f"token (shown once; give it to {token.name}): {plain}")
    print("config line, under auth.tokens:")
    print(f"  - {{name: {token.name}, scopes: [{scopes}], sha256: {digest(plain).hex()}}}")
    return 0
