"""The scenarios shipped with gpuscope (``src/gpuscope/sim/scenarios/*.yaml``)."""

from __future__ import annotations

from pathlib import Path

SCENARIO_DIR = Path(__file__).parent / "scenarios"


def builtin_names() -> list[str]:
    """Names of the built-in scenarios, without the .yaml suffix."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def builtin_scenario(name: str) -> Path:
    """The path of a built-in scenario (``demo``, ``healthy-3h``, ``xid``, ...)."""
    stem = name.removesuffix(".yaml")
    path = SCENARIO_DIR / f"{stem}.yaml"
    if not path.is_file():
        raise KeyError(f"no built-in scenario {name!r} (known: {', '.join(builtin_names())})")
    return path
