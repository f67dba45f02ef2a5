"""Remembered batch ids: exact de-duplication within the bounds, in 16 bytes an id."""

from __future__ import annotations

import threading
import tracemalloc

from gpuscope.store.batch_ids import SEAL_EVERY, BatchIds, Claim


def _store(ids: BatchIds, bid: str, now: float) -> Claim:
    claim = ids.claim(bid)
    if claim is Claim.NEW:
        ids.finish(bid, True, now)
    return claim


def test_every_retry_of_a_remembered_id_is_a_duplicate_across_seals() -> None:
    ids = BatchIds(capacity=10_000, ttl_s=3600.0, seal_every=100)
    names = [f"node-{i % 7}:{i}" for i in range(5_000)]
    assert [_store(ids, b, 1000.0 + i / 100) for i, b in enumerate(names)] == [Claim.NEW] * 5_000
    assert all(_store(ids, b, 1100.0) is Claim.DUPLICATE for b in names)
    assert all(b in ids for b in names)
    assert "node-0:5000" not in ids and _store(ids, "node-0:5000", 1100.0) is Claim.NEW


def test_new_ids_wait_in_the_dict_at_most_seal_every_at_a_time() -> None:
    ids = BatchIds(capacity=10_000, ttl_s=3600.0, seal_every=100)
    held = []
    for i in range(1_000):
        _store(ids, f"b{i}", float(i))
        held.append(len(ids._fresh))
    assert max(held) == 99 and len(ids) == 1_000


def test_the_count_bound_keeps_the_newest_ids() -> None:
    ids = BatchIds(capacity=1_000, ttl_s=1e9, seal_every=100)
    for i in range(5_000):
        _store(ids, f"b{i}", float(i))
    assert len(ids) <= 1_000 + 100
    assert all(f"b{i}" in ids for i in range(4_000, 5_000))
    assert not any(f"b{i}" in ids for i in range(3_800))


def test_the_age_bound_forgets_ids_older_than_the_ttl() -> None:
    ids = BatchIds(capacity=1_000_000, ttl_s=60.0, seal_every=10)
    for i in range(100):
        _store(ids, f"old{i}", 0.0)
    for i in range(100):
        _store(ids, f"new{i}", 1000.0)
    assert not any(f"old{i}" in ids for i in range(100))
    assert all(f"new{i}" in ids for i in range(100))


def test_a_failed_store_is_not_remembered_and_a_concurrent_retry_waits_for_the_outcome() -> None:
    ids = BatchIds(capacity=100, ttl_s=60.0)
    assert ids.claim("x") is Claim.NEW
    outcome: list[Claim] = []
    waiter = threading.Thread(target=lambda: outcome.append(ids.claim("x")))
    waiter.start()
    ids.finish("x", False, 1.0)  # the first copy failed: the retry owns it now
    waiter.join(5)
    assert outcome == [Claim.NEW]
    ids.finish("x", True, 2.0)
    assert ids.claim("x") is Claim.DUPLICATE


def test_retries_waiting_on_an_id_being_stored_are_duplicates_once_it_is_stored() -> None:
    ids = BatchIds(capacity=100, ttl_s=60.0)
    assert ids.claim("x") is Claim.NEW
    outcome: list[Claim] = []
    waiters = [threading.Thread(target=lambda: outcome.append(ids.claim("x"))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    ids.finish("x", True, 1.0)  # whether or not the retries were already waiting
    for waiter in waiters:
        waiter.join(5)
    assert outcome == [Claim.DUPLICATE] * 3
    assert ids.claim("y") is Claim.NEW  # other ids are not held up meanwhile


def test_loading_stored_ids_makes_their_retries_duplicates() -> None:
    ids = BatchIds(capacity=100, ttl_s=60.0, seal_every=7)
    ids.load((f"s{i}", 5.0) for i in range(50))
    assert all(ids.claim(f"s{i}") is Claim.DUPLICATE for i in range(50))


def test_remembered_ids_take_about_16_bytes_each() -> None:
    # an eighth of a million ids with an eighth of the default seal_every: the same 61 merges and
    # the same share of ids still in the fresh dict as a million ids at the default, in an eighth
    # of the time (tracemalloc slows the hashing about fourfold)
    n, seal_every = 125_000, SEAL_EVERY // 8
    ids = BatchIds(capacity=1_000_000, ttl_s=86_400.0, seal_every=seal_every)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ids.load((f"node-{i % 1024}:{1764600000 + i // 1024}.000", 1000.0) for i in range(n))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(ids) == n and len(ids._fresh) == n % seal_every > 0
    # a dict of the id strings took about 200 bytes an id
    assert held < 24 * n, held
    assert ids.nbytes() < 24 * n
