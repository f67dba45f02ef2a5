"""gpuscope: monitoring for GPU clusters and the ML work running on them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpuscope.sdk import init as init
    from gpuscope.sdk.inference import serve as serve


def __getattr__(name: str) -> Any:
    """``gpuscope.init`` without importing the SDK (and its HTTP client) on ``import gpuscope``."""
    if name == "init":
        from gpuscope.sdk import init

        return init
    if name == "serve":
        from gpuscope.sdk.inference import serve

        return serve
    raise AttributeError(f"module 'gpuscope' has no attribute {name!r}")
