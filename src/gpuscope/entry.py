"""The ``gpuscope`` console script: the base install is the SDK alone, the command needs ``[hub]``."""

from __future__ import annotations

import importlib
import sys

# import names of the distributions of the ``hub`` extra (pyproject.toml)
HUB_EXTRA_MODULES = frozenset(
    {"duckdb", "starlette", "uvicorn", "httptools", "uvloop", "rich", "yaml", "psutil", "pynvml"}
    | {"psycopg", "google", "cramjam", "opentelemetry"}
)


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The hub-extra module whose absence ``exc`` reports, or None for any other import failure."""
    top = (exc.name or "").partition(".")[0]
    return top if top in HUB_EXTRA_MODULES else None


def main() -> int:
    try:
        return int(importlib.import_module("gpuscope.cli").main())
    except ModuleNotFoundError as exc:
        module = missing_extra(exc)
        if module is None:
            raise
        sys.stderr.write(
            f"gpuscope: the command line needs the hub extra (module {module!r} is not installed); "
            "install it with: pip install 'gpuscope[hub]'\n"
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
