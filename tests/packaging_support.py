"""Building the project's wheel for install tests, offline (no build isolation, from a copy), and
installing into fresh venvs with uv, the installer ``make demo`` and ``make test`` use."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
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


def fresh_venv(path: Path) -> Path:
    """A new venv without a pip of its own (ensurepip alone takes seconds of CPU): :func:`uv_pip`
    installs into it from outside. Returns its python."""
    venv.create(path, with_pip=False)
    return path / "bin" / "python"


def uv_pip(
    python: Path, command: str, args: list[str | Path], env: dict[str, str], timeout: float = 120
) -> str:
    """``uv pip <command>`` (the uv of this process's venv) on the venv of ``python``; its output.
    uv, unlike pip, writes no bytecode at install: the first import does, for the modules that run."""
    done = subprocess.run(
        [sys.executable, "-m", "uv", "pip", command, "--python", python, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
