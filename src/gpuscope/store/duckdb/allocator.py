"""What DuckDB's own jemalloc holds, read through the ``mallctl`` its Python module exports.

DuckDB links a jemalloc of its own (symbols prefixed ``duckdb_je_``; duckdb/duckdb
``third_party/jemalloc``), which neither glibc's ``malloc_trim`` nor ``duckdb_memory()`` sees: a
seal's freed pages stay resident there (``dirty``) until an arena purges them. ``duckdb_je_mallctl``
is an exported symbol of the installed module (``_duckdb``): opening that same file again gives
the handle of the copy already loaded, so these are the live counters of the store's allocator.
Where the symbol or a statistic is missing (another build, jemalloc without stats), the reading
is empty: nothing here may fail a store.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
from collections.abc import Callable

#: ``MALLCTL_ARENAS_ALL`` of jemalloc 5: the arena index that merges every arena's statistics
ARENAS_ALL = 4096
#: state -> jemalloc's statistic, in bytes (jemalloc's ``mallctl`` manual, "stats.*")
BYTE_STATS = {
    "allocated": "stats.allocated",  # in use by DuckDB
    "active": "stats.active",  # pages holding allocations
    "metadata": "stats.metadata",
    "resident": "stats.resident",  # pages jemalloc holds in RAM, dirty ones included
    "mapped": "stats.mapped",
    "retained": "stats.retained",  # address space kept, not resident
}
#: state -> page count of every arena: freed but not yet returned to the OS
PAGE_STATS = {
    "dirty": f"stats.arenas.{ARENAS_ALL}.pdirty",
    "muzzy": f"stats.arenas.{ARENAS_ALL}.pmuzzy",
}

_Mallctl = Callable[[bytes, object, object, object, int], int]


def _module_path() -> str | None:
    spec = importlib.util.find_spec("_duckdb")
    return spec.origin if spec is not None else None


def _load() -> _Mallctl | None:
    path = _module_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        fn = lib.duckdb_je_mallctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    fn.restype = ctypes.c_int
    mallctl: _Mallctl = fn
    return mallctl


class JemallocStats:
    """Reads DuckDB's jemalloc statistics; :meth:`read` is empty where they are not offered."""

    def __init__(self) -> None:
        self._mallctl = _load()
        self._lock = threading.Lock()  # the epoch refresh and the reads that follow it, together

    @property
    def available(self) -> bool:
        return self._mallctl is not None

    def _get(self, name: str) -> int | None:
        assert self._mallctl is not None
        value = ctypes.c_size_t()
        size = ctypes.c_size_t(ctypes.sizeof(value))
        rc = self._mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0)
        return int(value.value) if rc == 0 else None

    def read(self) -> dict[str, int]:
        """Bytes by state (allocated, active, dirty, muzzy, resident, …), as of now."""
        if self._mallctl is None:
            return {}
        with self._lock:
            # jemalloc's statistics are a snapshot taken when the epoch is advanced
            epoch = ctypes.c_uint64(1)
            size = ctypes.c_size_t(ctypes.sizeof(epoch))
            if self._mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), 8):
                return {}
            page = self._get("arenas.page")
            out = {state: v for state, name in BYTE_STATS.items() if (v := self._get(name)) is not None}
            if page is not None:
                for state, name in PAGE_STATS.items():
                    if (pages := self._get(name)) is not None:
                        out[state] = pages * page
        return out


#: one reader per process: jemalloc is the process's, shared by every store in it
ALLOCATOR = JemallocStats()
