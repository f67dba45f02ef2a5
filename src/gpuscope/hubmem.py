"""Who owns a hub process's resident set: the interpreter's object allocator, glibc's heaps,
thread stacks, the libraries' files, and what is left for the allocators of DuckDB and numpy
(issue 13 (d): the level between upkeeps was "outside every accounting").

Two readings. In process, cheap enough for every scrape: pymalloc's own statistics (CPython's
``_PyObject_DebugMallocStats`` written into an ``open_memstream`` buffer: a walk of its arenas'
pools, not of its blocks) and the number of threads. From ``/proc/PID/smaps``, for a bench or an
operator looking at a pid: every mapping's resident bytes sorted by who made it, from the
mapping's shape alone (glibc's heaps, thread stacks with their guard page, files by name).
Where CPython, glibc or ``/proc`` do not offer a reading, it is absent (``None``), never an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: glibc's ``HEAP_MAX_SIZE`` on 64-bit (malloc/arena.c: 2 * DEFAULT_MMAP_THRESHOLD_MAX): every
#: arena but the main one lives in heaps of this size, aligned to it
GLIBC_HEAP_BYTES = 64 * 2**20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: the largest mapping read as a thread's stack (glibc's default is RLIMIT_STACK, 8 MiB)
STACK_MAX_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class PyMalloc:
    """The interpreter's small-object allocator (blocks up to 512 bytes, in 1-MiB arenas mapped
    on their own, each returned only once every block in it is free)."""

    arenas: int
    arena_bytes: int  # mapped for arenas (resident as far as touched)
    in_use_bytes: int  # in allocated blocks
    free_bytes: int  # free blocks of used pools, and free pools, inside the arenas


_STAT = re.compile(r"^#?\s*(.+?)\s*=\s*([\d,]+)\s*$")


def open_libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be found or loaded."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _libc_streams() -> ctypes.CDLL | None:
    lib = open_libc()
    if lib is None or not hasattr(lib, "open_memstream"):
        return None
    lib.open_memstream.restype = ctypes.c_void_p
    lib.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    lib.fclose.restype = ctypes.c_int
    lib.fclose.argtypes = [ctypes.c_void_p]
    lib.free.restype = None
    lib.free.argtypes = [ctypes.c_void_p]
    return lib


_LIBC = _libc_streams()
_STATS_FN = getattr(ctypes.pythonapi, "_PyObject_DebugMallocStats", None)
if _STATS_FN is not None:
    _STATS_FN.argtypes = [ctypes.c_void_p]
    _STATS_FN.restype = ctypes.c_int


def pymalloc_text() -> str | None:
    """What ``sys._debugmallocstats()`` prints, read into a string instead of the C stderr (which a
    hub's log may be); None where CPython or the C library do not offer it."""
    if _LIBC is None or _STATS_FN is None:
        return None
    buf = ctypes.c_void_p()
    size = ctypes.c_size_t()
    stream = _LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    try:
        printed = _STATS_FN(stream)
    finally:
        _LIBC.fclose(stream)  # flushes: buf and size are valid after this
    try:
        return (
            ctypes.string_at(buf.value, size.value).decode(errors="replace")
            if printed and buf.value
            else None
        )
    finally:
        _LIBC.free(buf)


def parse_pymalloc(text: str) -> PyMalloc | None:
    """The figures of one ``_PyObject_DebugMallocStats`` report (CPython 3.8 and later); None
    where its arena lines are missing (another allocator, e.g. mimalloc in a free-threaded build)."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if (m := _STAT.match(line)) is not None:
            stats.setdefault(m.group(1), int(m.group(2).replace(",", "")))
    arenas = stats.get("arenas allocated current")
    in_use = stats.get("bytes in allocated blocks")
    if arenas is None or in_use is None:
        return None
    arena_size = next((v // arenas for k, v in stats.items() if k.endswith("bytes/arena") and arenas), 2**20)
    mapped = arenas * arena_size
    return PyMalloc(
        arenas=arenas, arena_bytes=mapped, in_use_bytes=in_use, free_bytes=max(0, mapped - in_use)
    )


def pymalloc() -> PyMalloc | None:
    text = pymalloc_text()
    return parse_pymalloc(text) if text is not None else None


def threads() -> int | None:
    """Threads of this process, native ones included (DuckDB's, jemalloc's, the server's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str  # "" for anonymous memory; "[heap]", "[stack]", ... for the kernel's own
    rss: int
    anonymous: int

    @property
    def size(self) -> int:
        return self.end - self.start


_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def parse_smaps(text: str) -> list[Mapping]:
    """The mappings of one ``/proc/PID/smaps``, in address order, with their Rss and Anonymous."""
    out: list[Mapping] = []
    head: tuple[int, int, str, str] | None = None
    rss = anon = 0

    def close() -> None:
        if head is not None:
            out.append(Mapping(head[0], head[1], head[2], head[3], rss, anon))

    for line in text.splitlines():
        if (m := _HEADER.match(line)) is not None:
            close()
            head = (int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4).strip())
            rss = anon = 0
        elif line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Anonymous:"):
            anon = int(line.split()[1]) * 1024
    close()
    return out


def _is_guard(m: Mapping) -> bool:
    return m.perms.startswith("---") and not m.path


def _owners(maps: list[Mapping]) -> Iterator[tuple[str, Mapping]]:
    for i, m in enumerate(maps):
        before = maps[i - 1] if i else None
        after = maps[i + 1] if i + 1 < len(maps) else None
        if m.path == "[heap]":
            yield "glibc_heap", m
        elif m.path.startswith("["):
            yield "stack" if m.path == "[stack]" else "kernel", m
        elif m.path:
            # a library's or a file's pages; what it wrote (relocations, its data) is anonymous
            yield "file", Mapping(m.start, m.end, m.perms, m.path, m.rss - m.anonymous, 0)
            yield "file_data", Mapping(m.start, m.end, m.perms, m.path, m.anonymous, m.anonymous)
        elif m.start % GLIBC_HEAP_BYTES == 0 and (
            m.size == GLIBC_HEAP_BYTES
            or (after is not None and _is_guard(after) and after.end == m.start + GLIBC_HEAP_BYTES)
        ):
            yield "glibc_heap", m
        elif (
            before is not None
            and _is_guard(before)
            and before.size == PAGE
            and before.end == m.start
            and m.perms.startswith("rw")
            and m.size <= STACK_MAX_BYTES
        ):
            yield "thread_stacks", m
        elif not _is_guard(m):
            yield "other_anonymous", m


def resident_by_owner(maps: Iterable[Mapping]) -> dict[str, int]:
    """Resident bytes by owner: ``file`` (libraries' code and read-only data, shared with the page
    cache), ``file_data`` (what the libraries wrote into their own pages), ``glibc_heap`` (malloc's
    main heap and its other arenas' heaps), ``thread_stacks``, ``stack`` (the main thread's),
    ``kernel`` (vdso and the like) and ``other_anonymous``: mappings of their own, which is where
    pymalloc's arenas, DuckDB's jemalloc, glibc's large blocks and numpy's large arrays lie."""
    out = dict.fromkeys(
        ("file", "file_data", "glibc_heap", "thread_stacks", "stack", "kernel", "other_anonymous"), 0
    )
    for owner, m in _owners(list(maps)):
        out[owner] += m.rss
    return out


def file_resident_by_name(maps: Iterable[Mapping], top: int = 6) -> dict[str, int]:
    """Resident bytes of the ``top`` largest files by base name, the rest as ``other files``."""
    sizes: dict[str, int] = {}
    for m in maps:
        if m.path and not m.path.startswith("["):
            name = os.path.basename(m.path)
            sizes[name] = sizes.get(name, 0) + m.rss
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:top])
    if len(ranked) > top:
        out["other files"] = sum(v for _, v in ranked[top:])
    return out


def read_smaps(pid: int | str = "self") -> list[Mapping] | None:
    try:
        with open(f"/proc/{pid}/smaps") as f:
            return parse_smaps(f.read())
    except OSError:
        return None
