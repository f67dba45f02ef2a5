"""The one wording of a refused config key: ``where.key: unknown key (known: a, b, c)``."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any


def unknown_key(section: Mapping[Any, Any], where: str, known: Set[str]) -> str | None:
    """The error for the first key of ``section`` (sorted) that ``known`` lacks, or None."""
    unknown = sorted((str(k) for k in section if k not in known), key=str)
    if not unknown:
        return None
    return f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})"


def check_keys(section: Mapping[Any, Any], where: str, known: Set[str]) -> None:
    """ValueError naming the first unknown key of ``section``."""
    message = unknown_key(section, where, known)
    if message is not None:
        raise ValueError(message)
