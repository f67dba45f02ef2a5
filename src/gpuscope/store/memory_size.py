"""The one grammar of a memory size in the config (``storage.memory_limit``) and in DuckDB's
``SET memory_limit``: checked before it reaches SQL."""

from __future__ import annotations

import re

#: DuckDB's ``memory_limit`` of a hub's file store (``storage.memory_limit``). Its buffer pool and
#: the upkeep's sort (a seal: ``COPY ... ORDER BY``) fill what they are allowed, so this is how far
#: RSS may rise above the hub's working set; for 64 nodes the hourly seal of before lifted RSS by
#: 356 MiB at 512MB and 154 MiB at 256MB, and failed (out of memory) at 128MB. A seal of one
#: ``storage.seal_interval_s`` holds far less (bench/bench_seal_memory.py).
DEFAULT_MEMORY_LIMIT = "256MB"
MEMORY_SIZE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})? ?(B|KB|MB|GB|KiB|MiB|GiB)")
#: ``storage.cache_limit``: the most of DuckDB's buffer pool that may hold cached table blocks
#: (``duckdb_memory()``'s BASE_TABLE) after each minute's upkeep. DuckDB keeps every block it
#: wrote (each checkpoint's rollups, events, training records) or read until the pool reaches
#: ``memory_limit``: a 64-node hub's cache grew by ~1.2 MiB a minute, for hours. A hub reads few of
#: them again (its detectors hold their own state); evicted blocks are read back from disk.
DEFAULT_CACHE_LIMIT = "16MB"
_UNITS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def size_bytes(text: str) -> int:
    """Bytes in a size :data:`MEMORY_SIZE` accepts (``ValueError`` otherwise), as DuckDB reads it."""
    match = MEMORY_SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size such as '512MB'")
    return int(float(text[: match.start(2)].strip()) * _UNITS[match.group(2)])
