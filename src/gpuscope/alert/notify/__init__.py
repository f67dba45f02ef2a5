"""Notifiers, one module per receiver kind; each registers itself (see :mod:`.base`)."""

from __future__ import annotations

import importlib
import pkgutil

from gpuscope.alert.notify.base import NOTIFIERS, Notifier


def load_notifiers() -> dict[str, type[Notifier]]:
    """Import every module of this package so its notifier registers; return the registry."""
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    return NOTIFIERS
