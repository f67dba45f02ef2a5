"""Where a hub process's memory is: resident set, the Python heap (its blocks and pymalloc's
arenas), glibc's malloc arenas, the threads, and the number of entries its own bounded
structures hold (for the hub's ``/metrics``, issue 13 (d)).

Everything here is cheap enough to read on every scrape: ``/proc/self/statm``, counters the
interpreter keeps anyway, ``mallinfo2`` (a walk of the arenas' bin heads, not of the heap) and
pymalloc's statistics (a walk of its pools, see :mod:`gpuscope.hubmem`).
``tracemalloc`` is not: it slows every allocation, so it is never switched on here.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass

from gpuscope import hubmem

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _MallInfo2(ctypes.Structure):
    # struct mallinfo2 of glibc >= 2.33 (malloc/malloc.h): ten size_t fields in this order
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes obtained from the system with brk (main arena)
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in blocks obtained with mmap
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # bytes free inside the arenas (kept, not returned to the system)
            "keepcost",
        )
    ]


#: mallopt's parameters (malloc/malloc.h): the number of arenas, the size from which a block is
#: mapped on its own (and unmapped when freed), and the free top of a heap that is given back
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
M_TRIM_THRESHOLD = -1
#: The hub's mmap threshold, fixed. glibc starts at 128 KiB but raises it to the size of each mapped
#: block freed, up to 32 MiB (and its trim threshold to twice that): once any buffer of 4 MiB was
#: freed, later blocks up to 4 MiB came from the arenas and stayed there, free,
#: after their own free, until a trim. Fixed, they go back to the system when freed.
MMAP_THRESHOLD_BYTES = 256 * 1024


def _libc() -> ctypes.CDLL | None:
    lib = hubmem.open_libc()
    if lib is None or not hasattr(lib, "mallinfo2") or not hasattr(lib, "malloc_trim"):
        return None  # not glibc, or a glibc older than 2.33
    lib.mallinfo2.restype = _MallInfo2
    lib.mallinfo2.argtypes = []
    lib.malloc_trim.restype = ctypes.c_int
    lib.malloc_trim.argtypes = [ctypes.c_size_t]
    lib.mallopt.restype = ctypes.c_int
    lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


_LIBC = _libc()


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    rss_bytes: int
    python_blocks: int  # objects allocated by the interpreter and not freed (sys.getallocatedblocks)
    gc_tracked: tuple[int, int, int]  # objects waiting in each gc generation
    malloc_in_use_bytes: int | None  # glibc: all arenas, in use by the program
    malloc_free_bytes: int | None  # glibc: free inside the arenas, still resident until trimmed
    malloc_mmap_bytes: int | None  # glibc: large blocks mapped on their own
    pymalloc: hubmem.PyMalloc | None = None  # the interpreter's small-object arenas
    threads: int | None = None  # native threads included


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def snapshot() -> ProcessMemory:
    counts = gc.get_count()
    info = _LIBC.mallinfo2() if _LIBC is not None else None
    return ProcessMemory(
        rss_bytes=rss_bytes(),
        python_blocks=sys.getallocatedblocks(),
        gc_tracked=(counts[0], counts[1], counts[2]),
        malloc_in_use_bytes=int(info.uordblks) if info is not None else None,
        malloc_free_bytes=int(info.fordblks) if info is not None else None,
        malloc_mmap_bytes=int(info.hblkhd) if info is not None else None,
        pymalloc=hubmem.pymalloc(),
        threads=hubmem.threads(),
    )


def trim() -> bool:
    """Give the free memory of every malloc arena back to the system; False where unsupported."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def limit_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas from now on (0: glibc's default, 8 per core); False where
    unsupported. Call it before the process starts its threads: arenas already made stay.

    glibc gives threads that allocate at once arenas of their own, each keeping what was freed in
    it: a hub's 30-odd request threads and DuckDB's workers held over 100 MiB free in 16 arenas."""
    if _LIBC is None:
        return False
    return arenas <= 0 or bool(_LIBC.mallopt(M_ARENA_MAX, arenas))


def fix_mmap_threshold(size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Blocks of ``size`` bytes or more are mapped on their own from now on, whatever was freed
    before (see :data:`MMAP_THRESHOLD_BYTES`); False where unsupported."""
    if _LIBC is None:
        return False
    # the trim threshold as glibc pairs it, in case a freed block had raised it already
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, size)) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, 2 * size))


def entries(obj: object) -> int:
    """Entries held in ``obj``'s container attributes (dicts, lists, deques, sets), one level deep:
    the size of a detector's or a cache's state, without each class having to report it."""
    fields: Iterable[object]
    if hasattr(obj, "__dict__"):
        fields = vars(obj).values()
    else:
        fields = (getattr(obj, name, None) for name in getattr(type(obj), "__slots__", ()))
    sized = (value for value in fields if isinstance(value, Sized) and not isinstance(value, str | bytes))
    return sum(len(value) for value in sized)


def structure_rows(parts: Mapping[str, object]) -> list[tuple[dict[str, str], float]]:
    """One row per named structure, for a gauge labelled ``structure``."""
    return [({"structure": name}, float(entries(obj))) for name, obj in sorted(parts.items())]
