"""A test run leaves a clone clean: what tests write (screenshots, reports) lies where git ignores
it, and nothing tracked lies there, so ``git status`` after ``make test`` shows no change."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support import ARTIFACTS

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


@pytest.fixture(autouse=True)
def _checkout() -> None:
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout (an unpacked sdist): nothing to keep clean")


def test_nothing_tracked_lies_where_git_ignores_files() -> None:
    tracked_but_ignored = git("ls-files", "--cached", "--ignored", "--exclude-standard").stdout.split()
    assert tracked_but_ignored == []  # a test that rewrites one of these dirties every clone


def test_what_the_tests_write_is_ignored() -> None:
    for written in (ARTIFACTS / "fleet-stall.png", ARTIFACTS / "dashboard" / "fleet.png"):
        relative = str(written.relative_to(ROOT))
        assert git("check-ignore", "--quiet", "--no-index", relative).returncode == 0, relative
