"""How often a DuckDB store seals its hot rows into Parquet pieces (``storage.seal_interval_s``).

The hot table and each seal's sort hold one interval of raw rows, so the interval bounds both
(bench/bench_seal_memory.py measures them); the pieces of each closed hour are merged into one file.
"""

from __future__ import annotations

#: ``storage.seal_interval_s``: chosen by bench/bench_seal_memory.py (see docs/scaling.md (d))
DEFAULT_SEAL_INTERVAL_S = 60.0


def seal_interval_error(seconds: float) -> str | None:
    """Why ``seconds`` cannot be a seal interval (``None``: it can). Pieces must tile the hours
    they are merged into: a whole number of minutes that divides an hour, or whole hours."""
    if not seconds >= 60 or seconds % 60:
        return f"must be a whole number of minutes, got {seconds:g}"
    if 3600 % seconds and seconds % 3600:
        return f"must divide an hour (60, 120, ..., 600, 900, 1200, 1800) or be whole hours, got {seconds:g}"
    return None
