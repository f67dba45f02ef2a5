"""How far rollups and retention have got: the watermarks shared by writer, upkeep and queries.

The writer must know where the 1-minute rollup stands to mark late rows, the planner must know
which time ranges each tier covers, and upkeep moves the marks. They live here, behind one lock,
and are persisted in the meta table by the transactions that move them.
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import numpy as np

from gpuscope.store.duckdb.planner import Tier
from gpuscope.store.duckdb.schema import get_meta, set_meta

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
_KEYS = ("wm_1m", "wm_1h", "raw_lo", "m_lo", "h_lo")


def _opt_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def later(a: int | None, b: int) -> int:
    """The later of a mark that may not be set yet and a new one (marks never move back)."""
    return b if a is None else max(a, b)


class Watermarks:
    """``wm_1m``/``wm_1h``: rollups are complete below these (ms). ``raw_lo``/``m_lo``/``h_lo``:
    retention removed rows below these. ``pending``: the 1-minute mark a running rollup is moving to.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wm_1m: int | None = None
        self.wm_1h: int | None = None
        self.raw_lo: int | None = None
        self.m_lo: int | None = None
        self.h_lo: int | None = None
        self.pending: int | None = None

    def load(self, con: duckdb.DuckDBPyConnection) -> None:
        for key in _KEYS:
            setattr(self, key, _opt_int(get_meta(con, key)))
        self.pending = self.wm_1m

    def save(self, con: duckdb.DuckDBPyConnection, **marks: int) -> None:
        """Persist marks in the caller's transaction; :meth:`apply` them after it commits."""
        for key, value in marks.items():
            set_meta(con, key, str(value))

    def apply(self, **marks: int) -> None:
        for key, value in marks.items():
            setattr(self, key, value)

    def tiers(self) -> list[Tier]:
        """What each table covers, for the query planner."""
        tiers = [Tier("raw", 0, self.raw_lo, None)]
        if self.wm_1m is not None:
            tiers.append(Tier("1m", MINUTE_MS, self.m_lo, self.wm_1m))
        if self.wm_1h is not None:
            tiers.append(Tier("1h", HOUR_MS, self.h_lo, self.wm_1h))
        return tiers

    def late_buckets(self, ts_arrays: list[np.ndarray[Any, Any]]) -> tuple[np.ndarray[Any, Any], int]:
        """1-minute buckets of rows that arrive after (or while) their bucket is rolled up, and how
        many such buckets are too old to roll up again (their raw rows are past retention).
        Call with :attr:`lock` held, in the transaction that stores the rows."""
        guard = self.pending
        empty = np.zeros(0, dtype=np.int64)
        if guard is None:
            return empty, 0
        late = [t[t < guard] for t in ts_arrays if len(t) and int(t.min()) < guard]
        if not late:
            return empty, 0
        buckets = np.unique(np.concatenate(late) // MINUTE_MS * MINUTE_MS)
        if self.raw_lo is None:
            return buckets, 0
        too_old = buckets < self.raw_lo
        return buckets[~too_old], int(np.count_nonzero(too_old))

    def as_dict(self) -> dict[str, int | None]:
        return {key: getattr(self, key) for key in _KEYS}
