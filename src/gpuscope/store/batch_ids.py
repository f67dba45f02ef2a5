"""Recently seen batch ids, so that a sender's retry of an acknowledged batch is stored once.

Bounded two ways: a count (the newest ``capacity`` ids) and an age (``ttl_s`` of wall-clock time,
because retries happen in real time whatever clock the data uses).

Each id is remembered as a 64-bit keyed hash (BLAKE2b with a key drawn per process, so nobody can
aim a collision at another sender's ids) and its receipt time, 16 bytes in numpy arrays instead
of about 200 bytes as a Python string in a dict: at the count bound, 16 MB instead of about
200 MiB. New ids go into a small dict (``seal_every`` of them at most); when it is full it is
merged into one sorted array of older hashes, and the bounds are applied then, so up to
``seal_every`` ids more than ``capacity`` (and ids up to one seal older than ``ttl_s``) may be
remembered: a retry is never missed for that, only recognised a little longer.

The price of hashing is a false duplicate: a new batch whose hash equals a remembered one is
taken for a retry. With at most ``n`` remembered hashes the chance for one new batch is at most
``n / 2**64``: for 1,065,536 ids, 5.8e-14; a 1,024-node hub (about 1,100 batches a second, 95
million a day) expects one such batch in about 500 years.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from enum import Enum

import numpy as np

from gpuscope.model import FloatArray

#: new ids held in the dict before they are merged into the sorted arrays. The dict costs about
#: 100 bytes an id until it is merged: at 65,536 a sawtooth of ~6 MiB in the hub's heap with a
#: period of ~16 minutes at 64 nodes; at this size ~1.6 MiB, for the same CPU per id (a million
#: ids: 0.32 -> 0.34 us an id, and 22 -> 6 ms per merge with the lock held)
SEAL_EVERY = 16_384
_KEY = os.urandom(16)


def id_hash(bid: str) -> int:
    """The 64-bit keyed hash a batch id is remembered by (this process's key)."""
    return int.from_bytes(hashlib.blake2b(bid.encode(), digest_size=8, key=_KEY).digest(), "little")


class Claim(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"


class BatchIds:
    def __init__(self, capacity: int, ttl_s: float, seal_every: int = SEAL_EVERY) -> None:
        if capacity < 1 or seal_every < 1:
            raise ValueError("capacity and seal_every must be at least 1")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.seal_every = seal_every
        self._lock = threading.Lock()
        #: older hashes, sorted, and when each was received
        self._keys: np.ndarray[tuple[int], np.dtype[np.uint64]] = np.zeros(0, np.uint64)
        self._times: FloatArray = np.zeros(0, np.float64)
        #: the newest hashes (at most ``seal_every``) and when each was received
        self._fresh: dict[int, float] = {}
        #: ids being stored right now, with their hash: a retry of one of them waits for the outcome
        self._pending: dict[str, int] = {}
        # one condition for the rare retry that waits, rather than an Event (a Condition and a
        # lock) made for every batch: on the event loop that was about 3 % of a request's CPU
        self._settled = threading.Condition(self._lock)
        self._waiting = 0

    def load(self, rows: Iterable[tuple[str, float]]) -> None:
        """Remember stored ids (at start), oldest first."""
        with self._lock:
            for bid, received in rows:
                self._remember(id_hash(bid), received)

    def claim(self, bid: str) -> Claim:
        """NEW (the caller now owns ``bid`` until :meth:`finish`) or DUPLICATE.

        If another caller is storing the same id right now, wait for its outcome: a duplicate
        only once that one is committed, a new claim if it failed.
        """
        key = id_hash(bid)
        with self._lock:
            while True:
                if self._known(key):
                    return Claim.DUPLICATE
                if bid not in self._pending:
                    self._pending[bid] = key
                    return Claim.NEW
                self._waiting += 1
                try:
                    self._settled.wait()
                finally:
                    self._waiting -= 1

    def try_claim(self, bid: str) -> Claim | None:
        """:meth:`claim` for a caller that must not wait: None while another caller is storing
        ``bid`` (nothing claimed)."""
        key = id_hash(bid)
        with self._lock:
            if self._known(key):
                return Claim.DUPLICATE
            if bid in self._pending:
                return None
            self._pending[bid] = key
            return Claim.NEW

    def finish(self, bid: str, stored: bool, now: float) -> None:
        with self._lock:
            key = self._pending.pop(bid, None)
            if stored:
                self._remember(id_hash(bid) if key is None else key, now)
            if self._waiting:
                self._settled.notify_all()

    def _known(self, key: int) -> bool:
        if key in self._fresh:
            return True
        keys = self._keys
        if not keys.size:  # nothing sealed yet
            return False
        at = int(np.searchsorted(keys, np.uint64(key)))
        return at < len(keys) and int(keys[at]) == key

    def _remember(self, key: int, received: float) -> None:
        self._fresh[key] = received
        if len(self._fresh) >= self.seal_every:
            self._seal(received)

    def _seal(self, now: float) -> None:
        """Merge the fresh hashes into the sorted arrays, then apply the age and count bounds."""
        fresh = np.fromiter(self._fresh.keys(), np.uint64, len(self._fresh))
        fresh_times = np.fromiter(self._fresh.values(), np.float64, len(self._fresh))
        self._fresh = {}
        order = np.argsort(fresh, kind="stable")
        fresh, fresh_times = fresh[order], fresh_times[order]
        at = np.searchsorted(self._keys, fresh)
        keys = np.insert(self._keys, at, fresh)
        times = np.insert(self._times, at, fresh_times)
        keep = times >= now - self.ttl_s
        if int(keep.sum()) > self.capacity:  # the newest ``capacity`` stay
            cut = np.partition(times[keep], -self.capacity)[-self.capacity]
            keep &= times >= cut
        if not keep.all():
            keys, times = keys[keep], times[keep]
        self._keys, self._times = keys, times

    def nbytes(self) -> int:
        """Bytes the remembered hashes take (the arrays, and about 100 per fresh dict entry)."""
        with self._lock:
            return int(self._keys.nbytes + self._times.nbytes) + 100 * len(self._fresh)

    def __len__(self) -> int:
        return len(self._keys) + len(self._fresh)

    def __contains__(self, bid: object) -> bool:
        """Whether ``bid`` was stored (and is still remembered)."""
        if not isinstance(bid, str):
            return False
        key = id_hash(bid)
        with self._lock:
            return self._known(key)
