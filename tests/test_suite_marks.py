"""``make check`` runs ``-m 'not integration'``: a test that starts a real process or server must
carry the mark, also when it gets one only through a fixture (tests/conftest.py marks those)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a module that asks for PostgreSQL through a fixture of its own (nodes -> postgres_dsn), with no
# module mark, and one that starts nothing
THROUGH_FIXTURE = "tests/cluster/test_membership.py"
PLAIN = "tests/test_config.py"


def _collected(marks: str) -> list[str]:
    """The modules collected from PLAIN and THROUGH_FIXTURE (in that order on the command line),
    in the order they would run."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",  # with addopts' -q: one "path::test" line per test, in run order
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-m",
            marks,
            PLAIN,
            THROUGH_FIXTURE,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr  # 5: nothing collected
    modules = [line.split("::")[0] for line in out.stdout.splitlines() if "::" in line]
    return list(dict.fromkeys(modules))


def test_make_check_leaves_out_tests_that_start_real_processes_through_fixtures() -> None:
    assert _collected("not integration") == [PLAIN]


def test_modules_with_integration_tests_are_dealt_out_first() -> None:
    assert _collected("") == [THROUGH_FIXTURE, PLAIN]


def _make_n(target: str) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run([make, "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_check_is_lint_types_and_the_tests_without_integration_while_make_test_runs_all() -> None:
    check = _make_n("check")
    assert any("ruff check" in line for line in check) and any(line.endswith("mypy") for line in check)
    (pytest_check,) = [line for line in check if "bin/pytest" in line]
    assert pytest_check.endswith("-m 'not integration'")
    (pytest_all,) = [line for line in _make_n("unit") if "bin/pytest" in line]
    assert " -m " not in pytest_all
