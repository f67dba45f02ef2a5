"""Building the project's wheel for install tests, offline (no build isolation, from a copy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def build_wheel(root: Path, tmp: Path) -> Path:
    src = tmp / "src-copy"  # built from a copy: the worktree gets no build/ or egg-info
    src.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, src / name)
    shutil.copytree(root / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, src],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("gpuscope-*.whl")
    return wheel
