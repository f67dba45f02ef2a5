"""The lineage registry: training run → checkpoint → model version → deployment, with aliases.

It lives in its own DuckDB file beside the hub's store (``<store>.lineage.duckdb``; in memory
for an in-memory store), so the store's schema and writer stay untouched. Sharded hubs hand it a
PostgreSQL connection speaking the same SQL instead (:class:`gpuscope.cluster.sql.PgSql`), so
every hub answers the same. Registering a version
and promoting one are also *events* (``model_version_registered`` / ``model_version_promoted``),
handed to ``emit`` (the hub's ingest), so detectors and the timeline see them like any other
fact. :meth:`LineageRegistry.changes_before` answers "what changed just before this regression".
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import duckdb
import orjson

from gpuscope.model import Event

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}$")
ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lineage_runs (job VARCHAR PRIMARY KEY, started_at DOUBLE, meta VARCHAR);
CREATE TABLE IF NOT EXISTS lineage_checkpoints (job VARCHAR, step BIGINT, manifest_hash VARCHAR,
    path VARCHAR, created_at DOUBLE, PRIMARY KEY (job, step));
CREATE TABLE IF NOT EXISTS lineage_versions (model VARCHAR, version VARCHAR, job VARCHAR, step BIGINT,
    metrics VARCHAR, created_at DOUBLE, PRIMARY KEY (model, version));
CREATE TABLE IF NOT EXISTS lineage_aliases (model VARCHAR, alias VARCHAR, version VARCHAR, set_at DOUBLE,
    PRIMARY KEY (model, alias));
CREATE TABLE IF NOT EXISTS lineage_deployments (service VARCHAR, model VARCHAR, version VARCHAR,
    promoted_at DOUBLE, traffic_share DOUBLE);
"""


class Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


class Sql(Protocol):
    """A connection in DuckDB's dialect: DuckDB itself, or PostgreSQL behind a translating seam."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Rows: ...
    def close(self) -> None: ...


class LineageError(ValueError):
    """A request the registry refuses; ``field`` names what was wrong (for the API's 4xx)."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise LineageError(field, f"must be a name of 1-128 letters, digits and _.:/@+- (got {value!r})")
    return value


def _step(value: Any) -> int:
    """A training step as the tables store it (BIGINT)."""
    if type(value) is not int or not 0 <= value < 2**63:
        raise LineageError("step", f"must be an integer in 0..2^63-1, got {value!r}")
    return value


def lineage_path(store_path: str) -> str:
    """Where the registry of a store at ``store_path`` lives."""
    return ":memory:" if store_path == ":memory:" else store_path + ".lineage.duckdb"


class LineageRegistry:
    def __init__(
        self,
        path: str = ":memory:",
        *,
        emit: Callable[[list[Event]], None] | None = None,
        clock: Callable[[], float] = time.time,
        con: Sql | None = None,
    ) -> None:
        if con is None:
            con = duckdb.connect(path)
            con.execute(_SCHEMA)
        self._con: Sql = con  # one given is already set up (its tables exist)
        self._lock = threading.Lock()
        self.emit = emit
        self.clock = clock

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def _rows(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def _write(self, sql: str, params: list[Any]) -> None:
        with self._lock:
            self._con.execute(sql, params)

    # -- writing ---------------------------------------------------------------------------------

    def add_run(self, job: str, meta: dict[str, Any] | None = None, started_at: float | None = None) -> None:
        _name(job, "job")
        self._write(
            "INSERT OR REPLACE INTO lineage_runs VALUES (?, ?, ?)",
            [job, started_at if started_at is not None else self.clock(), orjson.dumps(meta or {}).decode()],
        )

    def add_checkpoint(
        self, job: str, step: int, manifest_hash: str, path: str = "", at: float | None = None
    ) -> None:
        _name(job, "job")
        _step(step)
        if not isinstance(manifest_hash, str) or not re.fullmatch(r"[0-9a-fA-F]{8,128}", manifest_hash):
            raise LineageError("manifest_hash", "must be 8-128 hex digits")
        if not self._rows("SELECT 1 FROM lineage_runs WHERE job = ?", [job]):
            self.add_run(job, {}, at)
        self._write(
            "INSERT OR REPLACE INTO lineage_checkpoints VALUES (?, ?, ?, ?, ?)",
            [job, step, manifest_hash.lower(), str(path), at if at is not None else self.clock()],
        )

    def register_version(
        self,
        model: str,
        version: str,
        job: str,
        step: int,
        metrics: dict[str, float] | None = None,
        at: float | None = None,
    ) -> None:
        """A model version made from checkpoint ``(job, step)``, which must be registered."""
        _name(model, "model")
        _name(version, "version")
        if version.startswith("@"):
            raise LineageError("version", "a version may not start with '@' (that names an alias)")
        _name(job, "job")
        _step(step)
        if not self._rows("SELECT 1 FROM lineage_checkpoints WHERE job = ? AND step = ?", [job, step]):
            raise LineageError("checkpoint", f"no checkpoint of job {job!r} at step {step}", 404)
        if self._rows("SELECT 1 FROM lineage_versions WHERE model = ? AND version = ?", [model, version]):
            raise LineageError("version", f"{model} {version} is already registered", 409)
        clean = {str(k): float(v) for k, v in (metrics or {}).items()}
        ts = at if at is not None else self.clock()
        self._write(
            "INSERT INTO lineage_versions VALUES (?, ?, ?, ?, ?, ?)",
            [model, version, job, step, orjson.dumps(clean).decode(), ts],
        )
        data = {"model": model, "version": version, "source": {"job": job, "step": step}, "metrics": clean}
        self._emit(Event(ts, "model_version_registered", {"model": model, "version": version}, data))

    def set_alias(self, model: str, alias: str, version: str, at: float | None = None) -> None:
        if not isinstance(alias, str) or not ALIAS.match(alias.lstrip("@")):
            raise LineageError("alias", f"must be a lower-case word like 'champion', got {alias!r}")
        self._require_version(model, version)
        self._write(
            "INSERT OR REPLACE INTO lineage_aliases VALUES (?, ?, ?, ?)",
            [model, alias.lstrip("@"), version, at if at is not None else self.clock()],
        )

    def promote(
        self,
        service: str,
        model: str,
        version: str,
        *,
        traffic_share: float = 1.0,
        alias: str | None = None,
        at: float | None = None,
    ) -> dict[str, Any]:
        """``version`` (or ``@alias``) starts serving ``service``; an event says so."""
        _name(service, "service")
        version = self.resolve(model, version)
        if not isinstance(traffic_share, int | float) or not 0.0 < float(traffic_share) <= 1.0:
            raise LineageError("traffic_share", "must be within (0, 1]")
        ts = at if at is not None else self.clock()
        self._write(
            "INSERT INTO lineage_deployments VALUES (?, ?, ?, ?, ?)",
            [service, model, version, ts, float(traffic_share)],
        )
        if alias:
            self.set_alias(model, alias, version, ts)
        info = self.version(model, version)
        data = {
            "model": model,
            "version": version,
            "service": service,
            "traffic_share": float(traffic_share),
            "source": info["checkpoint"],
        }
        self._emit(
            Event(
                ts, "model_version_promoted", {"service": service, "model": model, "version": version}, data
            )
        )
        return data

    def _emit(self, event: Event) -> None:
        if self.emit is not None:
            self.emit([event])

    # -- reading ---------------------------------------------------------------------------------

    def _require_version(self, model: str, version: str) -> None:
        if not self._rows("SELECT 1 FROM lineage_versions WHERE model = ? AND version = ?", [model, version]):
            raise LineageError("version", f"{model} {version} is not registered", 404)

    def resolve(self, model: str, version: str) -> str:
        """A version, or the version an ``@alias`` points at."""
        _name(model, "model")
        if isinstance(version, str) and version.startswith("@"):
            rows = self._rows(
                "SELECT version FROM lineage_aliases WHERE model = ? AND alias = ?", [model, version[1:]]
            )
            if not rows:
                raise LineageError("version", f"{model} has no alias {version}", 404)
            return str(rows[0][0])
        _name(version, "version")
        self._require_version(model, version)
        return version

    def version(self, model: str, version: str) -> dict[str, Any]:
        """A version with the checkpoint and training run behind it, its aliases and deployments."""
        version = self.resolve(model, version)
        ((job, step, metrics, created),) = self._rows(
            "SELECT job, step, metrics, created_at FROM lineage_versions WHERE model = ? AND version = ?",
            [model, version],
        )
        ((manifest, path, ck_at),) = self._rows(
            "SELECT manifest_hash, path, created_at FROM lineage_checkpoints WHERE job = ? AND step = ?",
            [job, step],
        )
        ((started, meta),) = self._rows("SELECT started_at, meta FROM lineage_runs WHERE job = ?", [job])
        aliases = [
            r[0]
            for r in self._rows(
                "SELECT alias FROM lineage_aliases WHERE model = ? AND version = ? ORDER BY alias",
                [model, version],
            )
        ]
        return {
            "model": model,
            "version": version,
            "registered_at": created,
            "metrics": orjson.loads(metrics),
            "aliases": aliases,
            "checkpoint": {"job": job, "step": step, "manifest_hash": manifest, "path": path, "at": ck_at},
            "run": {"job": job, "started_at": started, "meta": orjson.loads(meta)},
            "deployments": self.deployments(model=model, version=version),
        }

    def deployments(
        self, service: str | None = None, model: str | None = None, version: str | None = None
    ) -> list[dict[str, Any]]:
        where, params = [], []
        for col, val in (("service", service), ("model", model), ("version", version)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        sql = "SELECT service, model, version, promoted_at, traffic_share FROM lineage_deployments"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._rows(sql + " ORDER BY promoted_at, rowid", params)
        keys = ("service", "model", "version", "promoted_at", "traffic_share")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def serving(self, service: str, at: float | None = None) -> dict[str, Any] | None:
        """The deployment in force for ``service`` at ``at`` (default: now)."""
        at = at if at is not None else self.clock()
        rows = [d for d in self.deployments(service=service) if d["promoted_at"] <= at]
        return rows[-1] if rows else None

    def changes_before(self, service: str, at: float, window: float = 3600.0) -> list[dict[str, Any]]:
        """What changed for ``service`` in the ``window`` seconds up to ``at``, newest first.

        Each promotion names the version it replaced and the training run and checkpoint behind
        the new one, and the run behind the previous one: the diff a person needs to start with.
        """
        history = self.deployments(service=service)
        out = []
        for i, d in enumerate(history):
            if not at - window <= d["promoted_at"] <= at:
                continue
            new = self.version(d["model"], d["version"])
            prev = history[i - 1] if i else None
            before = self.version(prev["model"], prev["version"]) if prev else None
            out.append(
                {
                    "kind": "promotion",
                    "at": d["promoted_at"],
                    "seconds_before": at - d["promoted_at"],
                    "service": service,
                    "model": d["model"],
                    "version": d["version"],
                    "traffic_share": d["traffic_share"],
                    "previous_version": prev["version"] if prev else None,
                    "checkpoint": new["checkpoint"],
                    "run": new["run"]["job"],
                    "previous_run": before["run"]["job"] if before else None,
                    "metrics": new["metrics"],
                    "previous_metrics": before["metrics"] if before else None,
                }
            )
        return sorted(out, key=lambda c: -float(c["at"]))
