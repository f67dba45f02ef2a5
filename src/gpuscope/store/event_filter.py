"""The WHERE clause of an events query, shared by the SQL stores (DuckDB and PostgreSQL meta)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscope.model import LABEL_KEY_RE, Labels


def event_filter(
    start: float,
    end: float,
    kind: str | None,
    labels: Labels | None,
    label_clause: Callable[[str, str], tuple[str, Any]],
    mark: str,
) -> tuple[str, list[Any]]:
    """Conditions (joined by AND) and their parameters for events in [start, end], of ``kind``,
    whose labels include ``labels``. ``label_clause(key, value)`` is the backend's condition for
    one label and its parameter; ``mark`` its placeholder (``?`` or ``%s``). A key that is not a
    label name is a :class:`ValueError` naming it (it may be spliced into ``label_clause``'s text)."""
    where = [f"ts >= {mark}", f"ts <= {mark}"]
    params: list[Any] = [start, end]
    if kind is not None:
        where.append(f"kind = {mark}")
        params.append(kind)
    for key, value in (labels or {}).items():
        if not LABEL_KEY_RE.fullmatch(key):
            raise ValueError(f"label key {key!r} is not a valid label name")
        clause, param = label_clause(key, value)
        where.append(clause)
        params.append(param)
    return " AND ".join(where), params
