"""The embedded backend: one DuckDB file, its telemetry chunks, rollups and watermarks
(:mod:`.store` is the :class:`~gpuscope.store.base.Store`; the other modules are its parts)."""

from gpuscope.store.duckdb.store import DuckDBStore

__all__ = ["DuckDBStore"]
