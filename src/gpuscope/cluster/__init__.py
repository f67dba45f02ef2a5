"""Sharded hubs: several hub processes share one cluster, with shared state in PostgreSQL.

Agents and SDKs may send to any hub; every answer names the hub owning the sender's shard
(``X-Gpuscope-Shard-Owner``), and senders follow it, so forwarding is the exception. Detection
for each node, job and service is owned by exactly
one live hub at a time (rendezvous hashing over the live members, enforced by one PostgreSQL
advisory lock per shard); alerts, their notifications and membership live in PostgreSQL, so every
hub answers the same. A hub that dies loses its locks with its connection, and the survivors take
its shards over, continuing its firing alerts. Silences, acknowledgements, alert history and the
lineage registry run their single-hub code on PostgreSQL (:mod:`.sql`); incidents are grouped over
the shared alerts; each hub's alerting service notifies the alerts it owns, through the shared
outbox, which is also the ledger of what was sent (:mod:`.outbox`): a route group whose alerts sit
on shards of different members is sent once per owning member. See :mod:`.membership`,
:mod:`.state`, :mod:`.outbox`, :mod:`.placement` and :mod:`.member`: the cluster is backends of
the hub's seams (:class:`~gpuscope.placement.Placement`, :class:`~gpuscope.alert.state.AlertState`,
:class:`~gpuscope.alert.outbox.OutboxBackend`, :class:`~gpuscope.alert.ledger.DispatchLedger`),
and :mod:`gpuscope.runtime` assembles a member.
"""
