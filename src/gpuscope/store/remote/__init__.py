"""A remote TSDB backend: telemetry over Prometheus remote-write, read back with PromQL.

Events, training records, alerts and batch ids live in a *meta* store beside it (a local DuckDB
file, or PostgreSQL shared by several hubs); see :class:`gpuscope.store.remote.prom_store.PromStore`.
"""
