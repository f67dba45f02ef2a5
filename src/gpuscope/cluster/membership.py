"""Membership and shard ownership, on PostgreSQL's own mechanisms.

A member is a row with a lease (renewed every ``lease_s / 5`` seconds, read on the database's
clock so hubs' clocks need not agree) plus a session-level advisory lock: a member is live while
its lease is current *and* its lock is held, so a hub that is killed (its connection closes, the
server drops its locks) is dead at once, not a lease later. Joins, leaves and released shards are
announced with NOTIFY; every member LISTENs and re-reads membership at once.

Shards go to live members by rendezvous hashing (:mod:`.ring`). A hub runs detection for a shard
only while its session holds that shard's advisory lock (``pg_try_advisory_lock``): on a change
it first lets go of shards it should no longer own (after its ``on_release`` callback has dropped
their state), then takes the ones it should own, retrying each tick until the previous owner has
let go or died. At most one session holds a lock, so at most one hub owns a shard at any time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from gpuscope.cluster.config import ClusterConfig
from gpuscope.cluster.ring import assign
from gpuscope.cluster.schema import CHANNEL, NS_MEMBER, NS_SHARD, create_schema
from gpuscope.counters import Counters

log = logging.getLogger("gpuscope.cluster")

ShardCallback = Callable[[set[int]], None]

_LIVE = """
SELECT m.hub_id, m.url FROM cluster_members m
WHERE m.lease_until > now() AND EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = %s::bigint::oid AND l.objid = m.lock_key::oid)
ORDER BY m.hub_id
"""


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection whose death PostgreSQL notices soon (TCP keepalives)."""
    return psycopg.connect(
        dsn, autocommit=True, keepalives=1, keepalives_idle=5, keepalives_interval=1, keepalives_count=3
    )


class ClusterNode:
    """This hub's membership: its lease, the live members, and the shards it owns."""

    def __init__(
        self,
        cfg: ClusterConfig,
        *,
        on_acquire: ShardCallback = lambda _s: None,
        on_release: ShardCallback = lambda _s: None,
        counters: Counters | None = None,
    ) -> None:
        self.cfg = cfg
        self.hub_id = cfg.hub_id
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.counters = counters or Counters()
        #: guards the connection (which holds the locks) and ownership; held while detection
        #: results for owned shards are written, so a shard is never released mid-write
        self.lock = threading.RLock()
        self.con = connect(cfg.postgres_dsn)
        self.owned: set[int] = set()
        self.members: dict[str, str] = {}
        self.assignment: dict[int, str] = {}
        self.last_change = time.time()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listen_con: psycopg.Connection[tuple[Any, ...]] | None = None

    # -- life ---------------------------------------------------------------------------------

    def join(self) -> None:
        """Register, take the member lock, announce, take shards, and keep all of it current."""
        with self.lock:
            create_schema(self.con, self.counters)
            self._register()
            self.rebalance()
        self._listen_con = connect(self.cfg.postgres_dsn)
        self._listen_con.execute(f"LISTEN {CHANNEL}")
        for target, name in ((self._renew_loop, "renew"), (self._listen_loop, "listen")):
            thread = threading.Thread(target=target, name=f"gpuscope-cluster-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def leave(self) -> None:
        """Hand every shard back at once and say so, so survivors need not wait for the lease."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        with self.lock:
            try:
                self._release(set(self.owned))
                self.con.execute("DELETE FROM cluster_members WHERE hub_id = %s", (self.hub_id,))
                self._notify(f"leave {self.hub_id}")
            except psycopg.Error:
                log.warning("leaving the cluster failed; peers will see the lease expire", exc_info=True)
            finally:
                self.con.close()
        if self._listen_con is not None:
            self._listen_con.close()

    # -- loops --------------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.cfg.renew_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                with self.lock:
                    self.con.execute(
                        "UPDATE cluster_members SET lease_until = now() + make_interval(secs => %s) "
                        "WHERE hub_id = %s",
                        (self.cfg.lease_s, self.hub_id),
                    )
                    self.rebalance()
            except psycopg.Error:
                # the session (and with it every lock) may be gone: own nothing until it is back
                self.counters.inc("cluster_renew_errors")
                log.exception("cluster lease renewal failed")
                self._reconnect()

    def _listen_loop(self) -> None:
        con = self._listen_con
        assert con is not None
        while not self._stop.is_set():
            try:
                for _ in con.notifies(timeout=0.5, stop_after=1):
                    self._wake.set()
            except psycopg.Error:
                if self._stop.is_set():
                    return
                self.counters.inc("cluster_listen_errors")
                time.sleep(self.cfg.renew_s)

    def _reconnect(self) -> None:
        with self.lock:
            if self.owned:
                self.on_release(set(self.owned))
                self.owned.clear()
            try:
                self.con.close()
                self.con = connect(self.cfg.postgres_dsn)
                self._register()
            except psycopg.Error:
                log.warning("cluster: PostgreSQL unreachable; retrying", exc_info=True)

    def _register(self) -> None:
        """Take a fresh member lock on this session and (re)write this hub's row with it."""
        (key,) = self.con.execute("SELECT nextval('cluster_member_seq')").fetchone() or (0,)
        self.con.execute("SELECT pg_advisory_lock(%s, %s)", (NS_MEMBER, int(key)))
        self.con.execute(
            "INSERT INTO cluster_members (hub_id, url, lock_key, lease_until) "
            "VALUES (%s, %s, %s, now() + make_interval(secs => %s)) ON CONFLICT (hub_id) DO UPDATE "
            "SET url = excluded.url, lock_key = excluded.lock_key, lease_until = excluded.lease_until, "
            "joined_at = now()",
            (self.hub_id, self.cfg.advertise_url, int(key), self.cfg.lease_s),
        )
        self._notify(f"join {self.hub_id}")

    # -- ownership ----------------------------------------------------------------------------

    def rebalance(self) -> None:
        """Bring owned shards in line with the ring over the live members (caller holds ``lock``)."""
        rows = self.con.execute(_LIVE, (NS_MEMBER,)).fetchall()
        members = {str(hub): str(url) for hub, url in rows}
        if members != self.members:
            log.info("cluster members: %s", ", ".join(sorted(members)))
            self.members = members
            self.last_change = time.time()
        self.assignment = assign(self.cfg.shards, members)
        want = {s for s, hub in self.assignment.items() if hub == self.hub_id}
        self._release(self.owned - want)
        gained: set[int] = set()
        for shard in sorted(want - self.owned):
            row = self.con.execute("SELECT pg_try_advisory_lock(%s, %s)", (NS_SHARD, shard)).fetchone()
            if row and row[0]:
                gained.add(shard)
        if gained:
            self.owned |= gained
            self.last_change = time.time()
            self.counters.inc("cluster_shards_acquired", len(gained))
            self.on_acquire(gained)

    def _release(self, shards: set[int]) -> None:
        if not shards:
            return
        self.on_release(shards)
        for shard in sorted(shards):
            self.con.execute("SELECT pg_advisory_unlock(%s, %s)", (NS_SHARD, shard))
        self.owned -= shards
        self.last_change = time.time()
        self.counters.inc("cluster_shards_released", len(shards))
        self._notify(f"released {self.hub_id}")

    def _notify(self, what: str) -> None:
        self.con.execute("SELECT pg_notify(%s, %s)", (CHANNEL, what))

    # -- questions ----------------------------------------------------------------------------

    def owns(self, shard: int) -> bool:
        return shard in self.owned

    def owner_url(self, shard: int) -> tuple[str, str] | None:
        """(hub id, URL) of the hub the ring gives ``shard`` to, as this hub last saw it."""
        hub = self.assignment.get(shard)
        if hub is None or hub not in self.members:
            return None
        return hub, self.members[hub]

    def status(self) -> dict[str, Any]:
        return {
            "hub_id": self.hub_id,
            "members": dict(self.members),
            "shards": self.cfg.shards,
            "owned_shards": sorted(self.owned),
            "assigned_shards": sum(1 for hub in self.assignment.values() if hub == self.hub_id),
            "last_change": self.last_change,
        }
