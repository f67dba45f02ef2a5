"""The SDK is a light base install; the hub is an extra; versions and pins each have one home."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import gpuscope
from gpuscope.entry import HUB_EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SDK_MODULES = ["gpuscope", "gpuscope.sdk", "gpuscope.sdk.inference", "gpuscope.sdk.verify"]
#: the installer's version has its home in the Makefile, which installs it before anything else
UV_VERSION = re.findall(r"^UV_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)[0]

# refuses every module of the hub extra, as a training environment without it would
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = PYPROJECT["project"]
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _constraints() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line:
            req = Requirement(line)
            assert not req.extras, f"constraints.txt: {line!r}: pip refuses extras in constraints"
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
            pins[req.name.lower()] = Version(spec.version)
    return pins


def _lower_bound(req: Requirement) -> Version:
    (low,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return low


def test_sdk_imports_nothing_from_the_hub_extra() -> None:
    """Before: ``gpuscope.agent``'s package init pulled the collectors (psutil, NVML) into the SDK."""
    script = BLOCKER + (
        f"import {', '.join(SDK_MODULES)}\n"
        "assert gpuscope.init and gpuscope.serve\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuscope')))\n"
    )
    blocked = ",".join(sorted(HUB_EXTRA_MODULES))
    done = subprocess.run(
        [sys.executable, "-c", script, blocked], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    # the SDK finds its GPU by UUID through the one NVML choke point (nvml_api imports no pynvml
    # until a session opens, and none opens without the driver); no collector, no agent
    collectors = {m for m in loaded if m.startswith("gpuscope.collect")}
    assert collectors <= {"gpuscope.collect", "gpuscope.collect.base", "gpuscope.collect.nvml_api"}, (
        collectors
    )
    assert "gpuscope.agent.agent" not in loaded


def test_the_command_without_the_hub_extra_says_how_to_get_it() -> None:
    script = BLOCKER + "from gpuscope.entry import main\nsys.exit(main())\n"
    done = subprocess.run(
        [sys.executable, "-c", script, "rich,duckdb", "alerts", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "pip install 'gpuscope[hub]'" in done.stderr and "Traceback" not in done.stderr


def test_ranges_in_pyproject_exact_pins_in_constraints() -> None:
    """Before: every runtime dependency was pinned exactly in pyproject.toml."""
    pins = _constraints()
    for req in [*_requirements(), *_requirements("hub")]:
        ops = {s.operator for s in req.specifier}
        assert ops == {">=", "<"}, f"{req}: a compatible range (>= tested, < next major) is expected"
        pin = pins[req.name.lower()]
        assert pin in req.specifier, f"constraints.txt pins {req.name} {pin} outside {req.specifier}"
    for req in _requirements("hub"):
        # the hub's lower bounds are the versions make test runs with
        assert _lower_bound(req) == pins[req.name.lower()], req
    runtime = {r.name.lower() for r in _requirements()} | {r.name.lower() for r in _requirements("hub")}
    extras = {f"{r.name.lower()}-{e}" for r in _requirements("hub") for e in r.extras}  # psycopg-binary
    assert runtime | extras == set(pins), "constraints.txt pins exactly the runtime dependencies"


def test_the_sdk_needs_only_three_libraries() -> None:
    assert sorted(r.name for r in _requirements()) == ["httpx", "numpy", "orjson"]


def test_version_has_one_home_and_the_changelog_names_it() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpuscope.__version__"}
    heading = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert heading is not None and heading.group(1) == gpuscope.__version__
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_make_demo_installs_the_hub_extra_only_with_progress() -> None:
    """Before: ``make demo`` ran ``pip install --quiet -e '.[dev]'`` (1.8 GB, silent for 85 s)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    demo = subprocess.run([make, "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert demo.returncode == 0, demo.stderr
    installs = [line for line in demo.stdout.splitlines() if " install " in line]
    assert installs[0] == f".venv/bin/pip install --quiet uv=={UV_VERSION}"  # the installer, from pip
    assert re.fullmatch(
        r"\.venv/bin/uv pip install --python \.venv/bin/python --constraint constraints\.txt"
        r"( --find-links \S+)* -e '\.\[hub\]'",
        installs[1],
    ), installs
    assert len(installs) == 2
    assert "about 250 MB" in demo.stdout  # says what is coming before the installer starts
    test = subprocess.run([make, "-n", "-B", "unit"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "-e '.[hub,dev]'" in test.stdout  # make test still installs everything


def test_the_installer_the_tests_use_is_the_one_the_makefile_pins() -> None:
    uv = [sys.executable, "-m", "uv", "--version"]
    done = subprocess.run(uv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["uv", UV_VERSION]


def test_make_runs_its_commands_with_bytecode_written_whatever_the_environment_says() -> None:
    """uv installs no bytecode: under an inherited PYTHONDONTWRITEBYTECODE every process of the
    suite (hubs, agents, torch ranks) would compile what it imports again."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    probe = ["--no-print-directory", "--eval", 'probe: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"', "probe"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([make, *probe], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
