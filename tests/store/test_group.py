"""Group commit: queued items are committed together; a failing item does not fail its group."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from gpuscope.store.group import GroupCommitter, WriterClosed


class HeldCommit:
    """A commit function that records each group and holds the first one until :meth:`release`, so
    that the items submitted meanwhile queue up behind it; ``result`` maps the committed items."""

    def __init__(self, result: Callable[[list[int]], list[int]] = list) -> None:
        self.groups: list[list[int]] = []
        self.result = result
        self._started = threading.Event()
        self._gate = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.groups.append(list(items))
        self._started.set()
        if len(self.groups) == 1:
            self._gate.wait(5)
        return self.result(items)

    def wait_started(self) -> None:
        """Until the first group is being committed (the writer is busy with it)."""
        assert self._started.wait(5), "the writer never called commit"

    def release(self) -> None:
        self._gate.set()


def test_items_queued_during_a_commit_are_coalesced() -> None:
    commit = HeldCommit(lambda items: [i * 10 for i in items])
    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100)
    first = writer.submit(0)
    commit.wait_started()
    rest = [writer.submit(i) for i in range(1, 6)]
    commit.release()
    assert [f.result(5) for f in [first, *rest]] == [0, 10, 20, 30, 40, 50]
    assert commit.groups == [[0], [1, 2, 3, 4, 5]]
    writer.close()
    with pytest.raises(WriterClosed):
        writer.submit(9)


def test_group_size_is_bounded_by_rows() -> None:
    commit = HeldCommit()
    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: i, max_group_rows=10)
    futures = [writer.submit(5)]
    commit.wait_started()
    futures += [writer.submit(n) for n in (4, 4, 4, 20)]
    commit.release()
    for f in futures:
        f.result(5)
    writer.close()
    assert commit.groups == [[5], [4, 4], [4], [20]]


def test_a_failing_item_fails_alone() -> None:
    def refuse_13(items: list[int]) -> list[int]:
        if 13 in items:
            raise ValueError("bad item 13")
        return items

    commit = HeldCommit(refuse_13)
    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100)
    first = writer.submit(1)
    commit.wait_started()
    good, bad, other = writer.submit(2), writer.submit(13), writer.submit(3)
    commit.release()
    assert (first.result(5), good.result(5), other.result(5)) == (1, 2, 3)
    with pytest.raises(ValueError, match="bad item 13"):
        bad.result(5)
    writer.close()
    assert commit.groups == [[1], [2, 13, 3], [2], [13], [3]]


def test_linger_gathers_a_wave_of_concurrent_senders() -> None:
    commit = HeldCommit()
    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100, linger_s=60)
    futures = [writer.submit(0)]
    commit.wait_started()
    futures += [writer.submit(1), writer.submit(2)]  # concurrent senders: a group of two
    commit.release()
    futures[-1].result(30)
    futures.append(writer.submit(3))  # the writer now waits for a second batch of the wave
    threading.Event().wait(0.05)
    futures.append(writer.submit(4))
    assert [f.result(30) for f in futures] == [0, 1, 2, 3, 4]
    assert commit.groups == [[0], [1, 2], [3, 4]]
    writer.close()


def test_a_lone_sender_never_lingers() -> None:
    commit = HeldCommit()
    commit.release()  # nothing held: each item is committed as it comes
    writer: GroupCommitter[int, int] = GroupCommitter(commit, lambda i: 1, max_group_rows=100, linger_s=600)
    assert [writer.submit(i).result(60) for i in range(3)] == [0, 1, 2]  # a linger would take 600 s
    assert commit.groups == [[0], [1], [2]]
    writer.close()
