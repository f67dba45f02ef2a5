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
