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


def write_error(what: str, exc: BaseException) -> StoreError:
    """The error for a failed write: :class:`StoreFull` when the disk is full."""
    text = str(exc)
    full = "No space left on device" in text or "Disk quota exceeded" in text
    return (StoreFull if full else StoreError)(f"{what}: {text}")
