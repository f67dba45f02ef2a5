"""``make check`` runs ``-m 'not integration'``: a test that starts a real process or server must
carry the mark, also when it gets one only through a fixture (tests/conftest.py marks those)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite_probe import PREFIX

ROOT = Path(__file__).resolve().parents[1]
# a module that asks for PostgreSQL through a fixture of its own (nodes -> postgres_dsn), with no
# module mark, and one that starts nothing
THROUGH_FIXTURE = "tests/cluster/test_membership.py"
PLAIN = "tests/test_config.py"


@functools.cache
def _collected() -> list[tuple[str, bool]]:
    """The modules collected from PLAIN and THROUGH_FIXTURE (in that order on the command line), in
    the order they would run, each with whether it has a test that ``-m 'not integration'`` keeps
    (one collection for both checks: each takes seconds)."""
    # the plugin is loaded before pytest's own pythonpath setting applies
    path = [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "suite_probe",
            PLAIN,
            THROUGH_FIXTURE,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    kept: dict[str, bool] = {}
    for line in out.stdout.splitlines():
        if line.startswith(PREFIX):
            nodeid, mark = line.removeprefix(PREFIX).strip().rsplit(" ", 1)
            module = nodeid.split("::")[0]
            kept[module] = kept.get(module, False) or mark == "plain"
    return list(kept.items())


def test_make_check_leaves_out_tests_that_start_real_processes_through_fixtures() -> None:
    assert [module for module, plain in _collected() if plain] == [PLAIN]


def test_modules_with_integration_tests_are_dealt_out_first() -> None:
    assert [module for module, _ in _collected()] == [THROUGH_FIXTURE, PLAIN]


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
