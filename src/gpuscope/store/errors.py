"""Errors of the store layer.

A store that cannot be opened safely (foreign file, corrupt file, newer schema) raises
:class:`StoreError` instead of resetting it: silently starting over would lose a user's history.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot do what was asked; the message says what and which file."""


class StoreFull(StoreError):
    """A write failed because the disk is full: nothing was stored, and retrying once space
    returns will succeed (the hub answers 507, senders keep the batch)."""


def disk_full(exc: BaseException) -> bool:
    """Whether a failed write failed for want of space (DuckDB says so only in its message)."""
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def write_error(what: str, exc: BaseException) -> StoreError:
    """The error for a failed write: :class:`StoreFull` when the disk is full."""
    return (StoreFull if disk_full(exc) else StoreError)(f"{what}: {exc}")
