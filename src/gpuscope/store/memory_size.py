"""The one grammar of a memory size in the config (``storage.memory_limit``) and in DuckDB's
``SET memory_limit``: checked before it reaches SQL."""

from __future__ import annotations

import re

MEMORY_SIZE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})? ?(B|KB|MB|GB|KiB|MiB|GiB)")
