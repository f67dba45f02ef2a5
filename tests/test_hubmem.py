"""Who owns a hub's resident set (gpuscope.hubmem): what an operator reads from a pid's smaps and
from the hub's /metrics when its RSS is higher than its allocators say."""

from __future__ import annotations

import os
import threading

from gpuscope import hubmem

MIB = 2**20
HEAP = hubmem.GLIBC_HEAP_BYTES


def _mapping(start: int, size: int, perms: str, path: str, rss_kb: int, anon_kb: int) -> str:
    return (
        f"{start:x}-{start + size:x} {perms} 00000000 00:00 0 {path}\n"
        f"Size: {size // 1024} kB\nRss: {rss_kb} kB\nPss: {rss_kb} kB\nAnonymous: {anon_kb} kB\n"
        "VmFlags: rd wr mr mw me ac\n"
    )


def _smaps() -> str:
    base = 0x7F00_0000_0000  # a multiple of glibc's 64-MiB heap alignment
    page = hubmem.PAGE
    return "".join(
        [
            _mapping(0x55_0000_0000, 4 * MIB, "r-xp", "/usr/lib/libpython3.so", 3000, 0),
            _mapping(0x55_0040_0000, 64 * 1024, "rw-p", "/usr/lib/libpython3.so", 64, 40),
            _mapping(0x55_0100_0000, 20 * MIB, "rw-p", "[heap]", 10_000, 10_000),
            # a glibc arena's heap: 8 MiB usable, the rest of its 64 MiB reserved
            _mapping(base, 8 * MIB, "rw-p", "", 6000, 6000),
            _mapping(base + 8 * MIB, HEAP - 8 * MIB, "---p", "", 0, 0),
            # a thread's stack: one guard page below 8 MiB
            _mapping(base + HEAP, page, "---p", "", 0, 0),
            _mapping(base + HEAP + page, 8 * MIB, "rw-p", "", 120, 120),
            # mappings of their own: pymalloc's arenas, jemalloc's extents
            _mapping(base + HEAP + 9 * MIB, 30 * MIB, "rw-p", "", 25_000, 25_000),
            _mapping(0x7FFF_0000_0000, 132 * 1024, "rw-p", "[stack]", 100, 100),
            _mapping(0x7FFF_1000_0000, 8 * 1024, "r-xp", "[vdso]", 8, 0),
        ]
    )


def test_each_mapping_of_a_hub_is_charged_to_whoever_made_it() -> None:
    maps = hubmem.parse_smaps(_smaps())
    owners = {k: v // 1024 for k, v in hubmem.resident_by_owner(maps).items()}
    assert owners == {
        "file": 3000 + 24,
        "file_data": 40,  # what the library wrote into its own pages
        "glibc_heap": 10_000 + 6000,  # the main heap and the arena's, not the reserved rest
        "thread_stacks": 120,
        "stack": 100,
        "kernel": 8,
        "other_anonymous": 25_000,
    }
    assert sum(owners.values()) == sum(m.rss for m in maps) // 1024  # nothing counted twice
    assert hubmem.file_resident_by_name(maps, top=1) == {"libpython3.so": 3064 * 1024}


def _threads_while_steady() -> tuple[int | None, set[str]]:
    for _ in range(100):
        tasks = set(os.listdir("/proc/self/task"))
        count = hubmem.threads()
        if set(os.listdir("/proc/self/task")) == tasks:
            return count, tasks
    raise AssertionError("this process's threads never held still for three readings")


def test_the_split_of_a_live_process_adds_up_to_its_resident_set() -> None:
    halt = threading.Event()
    workers = [threading.Thread(target=halt.wait) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        maps = hubmem.read_smaps()
        assert maps is not None
        owners = hubmem.resident_by_owner(maps)
        # native threads of earlier tests in this worker (DuckDB's pools, torch's) come and go
        # meanwhile: the count is judged against the tasks listed around it, and ours among them
        count, tasks = _threads_while_steady()
        assert count == len(tasks)
        assert {str(w.native_id) for w in workers} <= tasks
        assert owners["thread_stacks"] > 0 and owners["file"] > 5 * MIB
        with open("/proc/self/smaps_rollup") as f:
            rollup = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Rss:"))
        # the rollup is read a moment later: the split of the same process is within a few %
        assert abs(sum(owners.values()) - rollup) < 0.05 * rollup
    finally:
        halt.set()
        for w in workers:
            w.join()


def test_pymalloc_reports_the_small_objects_a_process_holds() -> None:
    before = hubmem.pymalloc()
    assert before is not None and before.arenas > 0
    held = [(i, float(i)) for i in range(200_000)]  # ~100 bytes of small blocks each
    after = hubmem.pymalloc()
    assert after is not None
    assert after.in_use_bytes - before.in_use_bytes > 10 * MIB
    assert after.arena_bytes >= after.in_use_bytes
    assert after.free_bytes == after.arena_bytes - after.in_use_bytes
    del held


def test_a_report_without_pymalloc_arenas_reads_as_absent() -> None:
    # e.g. PYTHONMALLOC=malloc, or a free-threaded build whose report has no arena lines
    assert hubmem.parse_pymalloc("Small block threshold = 512\n") is None
    text = (
        "# arenas allocated current           =                  3\n"
        "3 arenas * 1048576 bytes/arena     =            3,145,728\n"
        "# bytes in allocated blocks        =            2,794,800\n"
    )
    assert hubmem.parse_pymalloc(text) == hubmem.PyMalloc(3, 3 * MIB, 2_794_800, 3 * MIB - 2_794_800)
