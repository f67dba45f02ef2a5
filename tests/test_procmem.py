"""Where a hub process's memory is (gpuscope.procmem): the readings /metrics exposes."""

from __future__ import annotations

import collections

from gpuscope import procmem
from support import freed_arena_memory


class _State:
    def __init__(self) -> None:
        self.by_gpu = {"a": 1, "b": 2}
        self.window: collections.deque[int] = collections.deque([1, 2, 3])
        self.name = "a string is not a container of entries"
        self.limit = 10


class _Slotted:
    __slots__ = ("count", "ids")

    def __init__(self) -> None:
        self.ids = {1, 2, 3, 4}
        self.count = 4


def test_entries_count_the_containers_of_an_object_one_level_deep() -> None:
    assert procmem.entries(_State()) == 5
    assert procmem.entries(_Slotted()) == 4
    assert procmem.structure_rows({"b": _Slotted(), "a": _State()}) == [
        ({"structure": "a"}, 5.0),
        ({"structure": "b"}, 4.0),
    ]


def test_snapshot_reads_resident_set_python_heap_and_malloc() -> None:
    mem = procmem.snapshot()
    assert mem.rss_bytes > 10 * 2**20
    assert mem.python_blocks > 1000
    assert mem.malloc_in_use_bytes is not None and mem.malloc_in_use_bytes > 0


def test_trim_hands_free_arena_memory_back_to_the_system() -> None:
    with freed_arena_memory():
        before = procmem.rss_bytes()
        freed = procmem.snapshot().malloc_free_bytes
        assert freed is not None and freed >= 60 * 2**20
        assert procmem.trim()
        assert procmem.rss_bytes() < before - 60 * 2**20
