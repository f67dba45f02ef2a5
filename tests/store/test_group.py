"""Group commit: queued items are committed together; a failing item does not fail its group."""

from __future__ import annotations

import threading

import pytest

from gpuscope.store.group import GroupCommitter, WriterClosed


def test_items_queued_during_a_commit_are_coalesced() -> None:
    gate = threading.Event()
    groups: list[list[int]] = []

    def commit(items: list[int]) -> list[int]:
        groups.append(list(items))
        if len(groups) == 1:
            gate.wait(5)
        return [i * 10 for i in items]

    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100)
    first = writer.submit(0)
    while not groups:
        threading.Event().wait(0.001)
    rest = [writer.submit(i) for i in range(1, 6)]
    gate.set()
    assert [f.result(5) for f in [first, *rest]] == [0, 10, 20, 30, 40, 50]
    assert groups == [[0], [1, 2, 3, 4, 5]]
    writer.close()
    with pytest.raises(WriterClosed):
        writer.submit(9)


def test_group_size_is_bounded_by_rows() -> None:
    gate = threading.Event()
    groups: list[list[int]] = []

    def commit(items: list[int]) -> list[int]:
        groups.append(list(items))
        gate.wait(5)
        return items

    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: i, max_group_rows=10)
    futures = [writer.submit(5)]
    while not groups:
        threading.Event().wait(0.001)
    futures += [writer.submit(n) for n in (4, 4, 4, 20)]
    gate.set()
    for f in futures:
        f.result(5)
    writer.close()
    assert groups == [[5], [4, 4], [4], [20]]


def test_a_failing_item_fails_alone() -> None:
    gate = threading.Event()
    seen: list[list[int]] = []

    def commit(items: list[int]) -> list[int]:
        seen.append(list(items))
        if len(seen) == 1:
            gate.wait(5)
        if 13 in items:
            raise ValueError("bad item 13")
        return items

    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100)
    first = writer.submit(1)
    while not seen:
        threading.Event().wait(0.001)
    good, bad, other = writer.submit(2), writer.submit(13), writer.submit(3)
    gate.set()
    assert (first.result(5), good.result(5), other.result(5)) == (1, 2, 3)
    with pytest.raises(ValueError, match="bad item 13"):
        bad.result(5)
    writer.close()
    assert seen == [[1], [2, 13, 3], [2], [13], [3]]


def test_linger_gathers_a_wave_of_concurrent_senders() -> None:
    gate = threading.Event()
    groups: list[list[int]] = []

    def commit(items: list[int]) -> list[int]:
        groups.append(list(items))
        if len(groups) == 1:
            gate.wait(5)
        return items

    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100, linger_s=60)
    futures = [writer.submit(0)]
    while not groups:
        threading.Event().wait(0.001)
    futures += [writer.submit(1), writer.submit(2)]  # concurrent senders: a group of two
    gate.set()
    futures[-1].result(30)
    futures.append(writer.submit(3))  # the writer now waits for a second batch of the wave
    threading.Event().wait(0.05)
    futures.append(writer.submit(4))
    assert [f.result(30) for f in futures] == [0, 1, 2, 3, 4]
    assert groups == [[0], [1, 2], [3, 4]]
    writer.close()


def test_a_lone_sender_never_lingers() -> None:
    groups: list[list[int]] = []

    def commit(items: list[int]) -> list[int]:
        groups.append(list(items))
        return items

    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100, linger_s=600)
    assert [writer.submit(i).result(60) for i in range(3)] == [0, 1, 2]  # a linger would take 600 s
    assert groups == [[0], [1], [2]]
    writer.close()
