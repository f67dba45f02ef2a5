"""The cluster's tables in PostgreSQL, and the advisory-lock key spaces it uses.

Advisory locks take two 32-bit keys; the first names what is locked (a member, a shard, a
receiver's outbox, the schema), the second which one. They belong to a database, so clusters in
different databases of one server never collide.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from gpuscope.cluster.txretry import in_tx
from gpuscope.counters import Counters

NS_SCHEMA = 0x6770_0001
NS_MEMBER = 0x6770_0002
NS_SHARD = 0x6770_0003
NS_OUTBOX = 0x6770_0004
NS_ALERT_VERSION = 0x6770_0005  # one key: held by every write of cluster_alerts until it commits

#: The NOTIFY channel on which members announce joins, leaves and released shards.
CHANNEL = "gpuscope_cluster"

#: The alert layer's state (:mod:`gpuscope.alert.statedb`): its SQLite schema in PostgreSQL's
#: types, less its ``outbox``: a cluster's notifications wait in ``cluster_outbox`` (:mod:`.outbox`).
ALERT_STATE_DDL = """
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY, doc TEXT NOT NULL, ends_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS acks (alert_id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    seq BIGSERIAL PRIMARY KEY,
    ts DOUBLE PRECISION NOT NULL,
    alert_id TEXT NOT NULL,
    what TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_alert ON history (alert_id, seq);
"""

#: The lineage registry (:mod:`gpuscope.lineage.registry`); ``seq`` stands in for DuckDB's rowid.
LINEAGE_DDL = """
CREATE TABLE IF NOT EXISTS lineage_runs (job TEXT PRIMARY KEY, started_at DOUBLE PRECISION, meta TEXT);
CREATE TABLE IF NOT EXISTS lineage_checkpoints (job TEXT, step BIGINT, manifest_hash TEXT, path TEXT,
    created_at DOUBLE PRECISION, PRIMARY KEY (job, step));
CREATE TABLE IF NOT EXISTS lineage_versions (model TEXT, version TEXT, job TEXT, step BIGINT, metrics TEXT,
    created_at DOUBLE PRECISION, PRIMARY KEY (model, version));
CREATE TABLE IF NOT EXISTS lineage_aliases (model TEXT, alias TEXT, version TEXT, set_at DOUBLE PRECISION,
    PRIMARY KEY (model, alias));
CREATE TABLE IF NOT EXISTS lineage_deployments (service TEXT, model TEXT, version TEXT,
    promoted_at DOUBLE PRECISION, traffic_share DOUBLE PRECISION, seq BIGSERIAL);
"""

_DDL = (
    """
CREATE TABLE IF NOT EXISTS cluster_schema (ddl TEXT PRIMARY KEY);
CREATE SEQUENCE IF NOT EXISTS cluster_member_seq;
CREATE TABLE IF NOT EXISTS cluster_members (
    hub_id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    lock_key BIGINT NOT NULL,
    joined_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS cluster_alert_seq;
CREATE TABLE IF NOT EXISTS cluster_alerts (
    id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL,
    rule TEXT NOT NULL,
    entity_key TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION,
    doc TEXT NOT NULL,
    hub_id TEXT NOT NULL,
    seq BIGSERIAL
);
CREATE UNIQUE INDEX IF NOT EXISTS cluster_alerts_one_firing ON cluster_alerts (rule, entity_key)
    WHERE resolved_at IS NULL;
CREATE INDEX IF NOT EXISTS cluster_alerts_shard ON cluster_alerts (shard) WHERE resolved_at IS NULL;
CREATE TABLE IF NOT EXISTS cluster_outbox (
    id BIGSERIAL PRIMARY KEY,
    dedup TEXT NOT NULL UNIQUE,
    receiver TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    delivered_at DOUBLE PRECISION,
    delivered_by TEXT,
    dead_at DOUBLE PRECISION,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS cluster_outbox_pending ON cluster_outbox (receiver, id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;
ALTER TABLE cluster_alerts ADD COLUMN IF NOT EXISTS places TEXT;
CREATE TABLE IF NOT EXISTS cluster_told (
    alert_id TEXT NOT NULL,
    receiver TEXT NOT NULL,
    status TEXT NOT NULL,
    escalation INTEGER NOT NULL,
    sent_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS cluster_told_alert ON cluster_told (alert_id);
ALTER TABLE cluster_told ADD COLUMN IF NOT EXISTS severity TEXT NOT NULL DEFAULT '';
CREATE SEQUENCE IF NOT EXISTS cluster_alert_version_seq;
ALTER TABLE cluster_alerts ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS cluster_alerts_version ON cluster_alerts (version);
"""
    + ALERT_STATE_DDL
    + LINEAGE_DDL
)


#: which DDL made the schema: a hub finding its own DDL's mark there runs none of it
DDL_MARK = hashlib.sha256(_DDL.encode()).hexdigest()[:16]


def _made(con: psycopg.Connection[Any]) -> bool:
    (table,) = con.execute("SELECT to_regclass('cluster_schema') IS NOT NULL").fetchone() or (False,)
    if not table:
        return False
    return con.execute("SELECT 1 FROM cluster_schema WHERE ddl = %s", (DDL_MARK,)).fetchone() is not None


def _create(con: psycopg.Connection[Any]) -> None:
    con.execute("SELECT pg_advisory_xact_lock(%s, 0)", (NS_SCHEMA,))
    if _made(con):
        return
    con.execute(_DDL)
    con.execute("INSERT INTO cluster_schema (ddl) VALUES (%s) ON CONFLICT DO NOTHING", (DDL_MARK,))


def create_schema(con: psycopg.Connection[Any], counters: Counters | None = None) -> None:
    """Create the tables once; concurrent hubs starting together wait for each other.

    A schema already made by this DDL is left alone: ``ALTER TABLE .. IF NOT EXISTS`` takes an
    ACCESS EXCLUSIVE lock and ``CREATE INDEX IF NOT EXISTS`` a SHARE lock on their table before
    they find there is nothing to do, and a connection opened while another member's transaction
    held a row of ``cluster_alerts`` (``SELECT .. FOR UPDATE``, then ``UPDATE``) closed a lock
    cycle with it: a deadlock, one side aborted."""
    in_tx(con, _create, counters if counters is not None else Counters())
