"""In-memory registries of entities and metric columns, so the append path never queries.

Ids are handed out by the caller threads that prepare batches and persisted by the writer in the
same transaction as the first rows that use them. An id stays *pending* until that commit
succeeds, so every batch that refers to it carries it until one of them has stored it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from gpuscope.model import ATTRIBUTION_LABELS, Labels

#: Per-row attribution columns of the telemetry tables, in a fixed order.
ATTR_COLUMNS: tuple[str, ...] = tuple(sorted(ATTRIBUTION_LABELS))

AttrValues = tuple[str | None, ...]
IntArray = npt.NDArray[np.int32]

REFUSED = -1


class EntityRegistry:
    """Identity label sets to integer ids, bounded by ``max_entities``; attribution label sets to codes."""

    def __init__(self, max_entities: int) -> None:
        self.max_entities = max_entities
        self._lock = threading.Lock()
        self._ids: dict[tuple[tuple[str, str], ...], int] = {}
        self._labels: list[Labels] = []
        self._pending: set[int] = set()
        self._index: dict[tuple[str, str], set[int]] = {}
        # Label items exactly as a sender spelled them -> (entity id or REFUSED, attribution code).
        # Senders repeat the same dicts every tick, so this skips sorting on the hot path.
        self._fast: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}
        self._attr_codes: dict[AttrValues, int] = {(None,) * len(ATTR_COLUMNS): 0}
        self._attr_values: list[AttrValues] = [(None,) * len(ATTR_COLUMNS)]
        self._attr_arrays: dict[str, npt.NDArray[np.object_]] | None = None

    def __len__(self) -> int:
        return len(self._labels)

    def load(self, rows: Iterable[tuple[int, Labels]]) -> None:
        """Register entities read back from the database (already persisted)."""
        with self._lock:
            for eid, labels in sorted(rows, key=lambda r: r[0]):
                if eid != len(self._labels):
                    raise ValueError(f"entity ids are not dense: expected {len(self._labels)}, found {eid}")
                self._add(labels)

    def _add(self, identity: Labels) -> int:
        eid = len(self._labels)
        key = tuple(sorted(identity.items()))
        self._ids[key] = eid
        self._labels.append(identity)
        for item in key:
            self._index.setdefault(item, set()).add(eid)
        return eid

    def attr_code(self, values: AttrValues) -> int:
        """The code of a tuple of attribution values (in ATTR_COLUMNS order), assigned if new."""
        with self._lock:
            return self._attr_code_locked(values)

    def _attr_code_locked(self, values: AttrValues) -> int:
        code = self._attr_codes.get(values)
        if code is None:
            code = len(self._attr_values)
            self._attr_codes[values] = code
            self._attr_values.append(values)
            self._attr_arrays = None
        return code

    def resolve(self, entities: Sequence[Labels]) -> tuple[IntArray, IntArray, list[Labels], list[int]]:
        """Ids and attribution codes of a frame's entities.

        Returns ``(ids, attr_codes, refused, pending)``: ``ids[i]`` is REFUSED for a label set beyond the
        cardinality limit (each distinct one listed once in ``refused``); ``pending`` lists the ids this
        frame uses that are not yet stored.
        """
        n = len(entities)
        ids = np.empty(n, dtype=np.int32)
        codes = np.empty(n, dtype=np.int32)
        refused: dict[tuple[tuple[str, str], ...], Labels] = {}
        pending: set[int] = set()
        with self._lock:
            fast = self._fast
            for i, labels in enumerate(entities):
                raw = tuple(labels.items())
                hit = fast.get(raw)
                if hit is None:
                    identity = {k: v for k, v in labels.items() if k not in ATTRIBUTION_LABELS}
                    key = tuple(sorted(identity.items()))
                    eid = self._ids.get(key)
                    if eid is None:
                        if len(self._labels) >= self.max_entities:
                            eid = REFUSED
                        else:
                            eid = self._add(identity)
                            self._pending.add(eid)
                    hit = (eid, self._attr_code_locked(tuple(labels.get(k) for k in ATTR_COLUMNS)))
                    if len(fast) > 4 * self.max_entities + 1024:
                        fast.clear()
                    fast[raw] = hit
                eid, code = hit
                ids[i] = eid
                codes[i] = code
                if eid == REFUSED:
                    refused.setdefault(raw, labels)
                elif self._pending and eid in self._pending:
                    pending.add(eid)
        return ids, codes, list(refused.values()), sorted(pending)

    def unpersisted(self, ids: Iterable[int]) -> list[tuple[int, Labels]]:
        """Of ``ids``, those still pending, with their identity labels (for the writer to insert)."""
        with self._lock:
            return [(i, self._labels[i]) for i in ids if i in self._pending]

    def mark_persisted(self, ids: Iterable[int]) -> None:
        with self._lock:
            self._pending.difference_update(ids)

    def labels(self, eid: int) -> Labels:
        return self._labels[eid]

    def attr_values(self, code: int) -> AttrValues:
        return self._attr_values[code]

    def attr_arrays(self) -> dict[str, npt.NDArray[np.object_]]:
        """For each attribution column, an object array indexed by attribution code."""
        with self._lock:
            if self._attr_arrays is None:
                self._attr_arrays = {
                    name: np.array([v[j] for v in self._attr_values], dtype=object)
                    for j, name in enumerate(ATTR_COLUMNS)
                }
            return self._attr_arrays

    def match(self, identity: Labels) -> list[int]:
        """Ids of entities whose identity labels include all of ``identity``."""
        with self._lock:
            if not identity:
                return list(range(len(self._labels)))
            sets = [self._index.get(item, set()) for item in identity.items()]
            sets.sort(key=len)
            return sorted(set.intersection(*sets)) if sets[0] else []

    def group_values(self, key: str) -> tuple[IntArray, list[str]]:
        """Entities that have label ``key``, and their value of it."""
        with self._lock:
            pairs = [(i, labels[key]) for i, labels in enumerate(self._labels) if key in labels]
        return np.array([p[0] for p in pairs], dtype=np.int32), [p[1] for p in pairs]


class ColumnRegistry:
    """Metric names to column numbers, bounded by ``limit`` (beyond it new names are refused)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._cols: dict[str, int] = {}
        self._names: list[str] = []
        self._pending: set[int] = set()

    def __len__(self) -> int:
        return len(self._names)

    def load(self, rows: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            for name, col in sorted(rows, key=lambda r: r[1]):
                if col != len(self._names):
                    raise ValueError(
                        f"metric columns are not dense: expected {len(self._names)}, found {col}"
                    )
                self._cols[name] = col
                self._names.append(name)

    def resolve(self, names: Sequence[str]) -> tuple[list[int], list[int]]:
        """Column of each name (REFUSED beyond the limit) and the columns among them not yet stored."""
        out: list[int] = []
        pending: list[int] = []
        with self._lock:
            for name in names:
                col = self._cols.get(name)
                if col is None:
                    if len(self._names) >= self.limit:
                        out.append(REFUSED)
                        continue
                    col = len(self._names)
                    self._cols[name] = col
                    self._names.append(name)
                    self._pending.add(col)
                if self._pending and col in self._pending:
                    pending.append(col)
                out.append(col)
        return out, pending

    def get(self, name: str) -> int | None:
        return self._cols.get(name)

    def name(self, col: int) -> str:
        return self._names[col]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def persisted(self) -> list[int]:
        """Columns that exist in the database (safe to name in queries)."""
        with self._lock:
            return [c for c in range(len(self._names)) if c not in self._pending]

    def still_pending(self, cols: Iterable[int]) -> tuple[int, ...]:
        with self._lock:
            return tuple(c for c in cols if c in self._pending)

    def unpersisted(self, cols: Iterable[int]) -> list[tuple[int, str]]:
        with self._lock:
            return [(c, self._names[c]) for c in cols if c in self._pending]

    def mark_persisted(self, cols: Iterable[int]) -> None:
        with self._lock:
            self._pending.difference_update(cols)
