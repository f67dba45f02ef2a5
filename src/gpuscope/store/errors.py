"""Errors of the store layer.

A store that cannot be opened safely (foreign file, corrupt file, newer schema) raises
:class:`StoreError` instead of resetting it: silently starting over would lose a user's history.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot do what was asked; the message says what and which file."""
