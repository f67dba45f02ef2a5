"""Sharded hubs: several hub processes share one cluster, with shared state in PostgreSQL.

Agents and SDKs may send to any hub. Detection for each node, job and service is owned by exactly
one live hub at a time (rendezvous hashing over the live members, enforced by one PostgreSQL
advisory lock per shard); alerts, their notifications and membership live in PostgreSQL, so every
hub answers the same. A hub that dies loses its locks with its connection, and the survivors take
its shards over, continuing its firing alerts. Silences, acknowledgements, alert history and the
lineage registry run their single-hub code on PostgreSQL (:mod:`.sql`); incidents are grouped over
the shared alerts; notification timing is kept in the shared outbox (:mod:`.notify`). See
:mod:`.membership`, :mod:`.state`, :mod:`.outbox`, :mod:`.placement` and :mod:`.member`: the
cluster is backends of the hub's seams (:class:`~gpuscope.placement.Placement`,
:class:`~gpuscope.alert.state.AlertState`), and :mod:`gpuscope.runtime` assembles a member.
"""
