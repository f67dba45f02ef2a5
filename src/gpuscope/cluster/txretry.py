"""Transactions PostgreSQL aborted to break a deadlock or a serialization conflict, run again.

PostgreSQL aborts one side of a lock cycle with ``deadlock_detected`` (40P01), and a conflicting
serializable transaction with ``serialization_failure`` (40001); the aborted transaction changed
nothing, and the manual's advice is to run it again ("Serialization Failure Handling" in the
chapter on concurrency control). :func:`in_tx` is where the cluster's transactions are opened and
re-run, a bounded number of times, after a jittered pause so the two sides do not meet again in
step; each re-run is counted (``cluster_tx_retries``). Only the transaction's own statements are
re-run: work with an effect outside the database (a notification sent) must not run inside one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors

from gpuscope.counters import Counters

T = TypeVar("T")

#: what PostgreSQL asks a client to run again
RETRYABLE: tuple[type[psycopg.Error], ...] = (errors.DeadlockDetected, errors.SerializationFailure)
#: runs of one transaction at most (the first and its re-runs)
ATTEMPTS = 5
#: the first pause's upper bound, seconds; doubled for each further re-run
PAUSE_S = 0.02
COUNTER = "cluster_tx_retries"


def in_tx(
    con: psycopg.Connection[Any],
    work: Callable[[psycopg.Connection[Any]], T],
    counters: Counters,
    *,
    attempts: int = ATTEMPTS,
    pause_s: float = PAUSE_S,
) -> T:
    """``work(con)`` in one transaction, committed on return; run again (at most ``attempts``
    runs in all) when PostgreSQL aborted it for a deadlock or a serialization failure, which is
    then raised after the last run. ``work`` must have no effect outside the transaction."""
    run = 1
    while True:
        try:
            with con.transaction():
                return work(con)
        except RETRYABLE:
            if run >= attempts:
                raise
        counters.inc(COUNTER)
        time.sleep(random.uniform(0.0, pause_s * 2 ** (run - 1)))
        run += 1
