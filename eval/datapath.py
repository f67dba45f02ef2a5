"""Where the evaluations find the real traces (``shared/data``; each script skips cleanly without).

``$GPUSCOPE_DATA`` if set; else the first ``shared/data`` folder beside the repository or one of
the folders above it, then beside or above the main checkout when the repository is a git
worktree (its ``.git`` file names the main checkout's ``.git/worktrees/NAME``), so that a worktree
kept apart from the main checkout finds the same data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _main_checkout(root: Path) -> Path | None:
    """The main checkout of the git worktree at ``root`` (None: not a worktree)."""
    marker = root / ".git"
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text.removeprefix("gitdir:").strip())
    if not gitdir.is_absolute():
        gitdir = (root / gitdir).resolve()
    # <main>/.git/worktrees/<name>
    return gitdir.parent.parent.parent if gitdir.parent.name == "worktrees" else None


def data_dir(root: Path = ROOT, env: Mapping[str, str] = os.environ) -> Path:
    """The folder of real traces; where it would be when it is found nowhere (the caller skips)."""
    if env.get("GPUSCOPE_DATA"):
        return Path(env["GPUSCOPE_DATA"])
    starts = [root]
    main = _main_checkout(root)
    if main is not None:
        starts.append(main)
    for start in starts:
        for up in start.parents:
            candidate = up / "shared" / "data"
            if candidate.is_dir():
                return candidate
    return root.parent / "shared" / "data"
