"""Which hub a sender posts to: its shard's owner once a hub named one, else a configured hub.

Any hub of a sharded cluster takes any batch, but a batch that reaches the hub owning the
sender's shard is detected there without being forwarded. Every ingest answer of a cluster member
names that owner in :data:`OWNER_HEADER`; the sender posts its next batches there. The owner
changes with membership, and the next answer says so. When the hub in use does not answer (it
died) or says it is the wrong one (421), the sender moves on to the next hub it knows (the
configured ones first, then owners it was told of), and the answer there names the new owner.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gpuscope.counters import Counters
from gpuscope.huburl import split_urls

log = logging.getLogger("gpuscope.agent.route")

#: the response header in which a cluster member names the hub owning the sender's shard
OWNER_HEADER = "X-Gpuscope-Shard-Owner"
#: owners remembered beyond the configured hubs (a cluster's members, as they came and went)
MAX_KNOWN = 64
#: how long a sender waits for a hub to accept its connection before it tries the next one
CONNECT_TIMEOUT_S = 2.0
#: how long a sender takes, at most, to reach a live hub after the one in use died: its next send
#: (agents and SDKs send about once a second) plus a connect timeout each for two dead hubs; the
#: next known hub is tried at once after a failed connection, without backoff
FAILOVER_S = 1.0 + 2 * CONNECT_TIMEOUT_S


def parse_hubs(hub_url: str) -> list[str]:
    """The hub base URLs of a ``--hub`` value: one URL, or several separated by commas."""
    return split_urls(hub_url)


class HubRoute:
    """The hub in use and the hubs to fall back on. Counters: ``hub_owner_moves`` (a hub named
    another owner), ``hub_fallbacks`` (the hub in use failed; the next known one is tried)."""

    def __init__(self, hubs: list[str], path: str, counters: Counters) -> None:
        self.path = path
        self.counters = counters
        self._configured = list(hubs)
        self._known = list(hubs)
        self.base = hubs[0]
        self._tried: set[str] = set()  # hubs that failed to connect since the last delivery
        # a sender configured for TLS never follows a hub's answer to a plain-text URL
        self.tls = any(h.startswith("https://") for h in hubs)

    @property
    def url(self) -> str:
        return self.base + self.path

    def answered(self, headers: Mapping[str, str]) -> None:
        """A hub stored a batch; follow the owner its answer names, if any."""
        self._tried.clear()
        owner = headers.get(OWNER_HEADER)
        if not owner:
            return
        owner = owner.strip().rstrip("/")
        if owner == self.base:
            return
        if not owner.startswith("https://" if self.tls else ("http://", "https://")):
            self.counters.inc("hub_owner_refused")
            return
        if owner not in self._known:
            if len(self._known) >= len(self._configured) + MAX_KNOWN:
                del self._known[len(self._configured)]  # the oldest learned owner
            self._known.append(owner)
        log.info("hub %s names %s as the owner of this sender's shard; sending there", self.base, owner)
        self.counters.inc("hub_owner_moves")
        self.base = owner

    def failed(self) -> None:
        """The hub in use did not answer, or is not the one: try the next hub known."""
        if len(self._known) < 2:
            return
        at = self._known.index(self.base) if self.base in self._known else -1
        self.base = self._known[(at + 1) % len(self._known)]
        self.counters.inc("hub_fallbacks")

    def fail_over(self) -> bool:
        """The hub in use refused the connection (gone, not slow): move to the next known hub.
        True when that one has not failed since the last delivery, so it may be tried at once;
        False once every known hub failed (then the sender backs off as usual)."""
        self._tried.add(self.base)
        self.failed()
        return self.base not in self._tried
