"""The SDK alone, from a wheel, in a fresh venv next to another numpy than the hub's, trains against a hub.

The wheel is built here without network (no build isolation); the SDK's three libraries come from
the package registry at their lowest allowed versions, so the lower bounds in pyproject.toml are the
ones tested.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import numpy
import pytest
from packaging.requirements import Requirement

from packaging_support import build_wheel, fresh_venv, uv_pip
from sdk.hubquery import events, records
from support import HubProcess, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import sys, time
import numpy
import gpuscope

run = gpuscope.init(job="venv-sdk", hub=sys.argv[1], state_dir=sys.argv[2], flush_interval=0.05)
weights = numpy.zeros(4)
for step in range(6):
    with run.step(tokens=128):
        weights += 0.5
        time.sleep(0.01)
    run.log(step, loss=float(1.0 / (1 + weights.sum())))
run.finish()
print(gpuscope.__file__)
print(numpy.__version__)
"""


def _lowest(requirements: list[str]) -> list[str]:
    pins = []
    for line in requirements:
        req = Requirement(line)
        (low,) = [s.version for s in req.specifier if s.operator == ">="]
        pins.append(f"{req.name}=={low}")
    return pins


def test_sdk_alone_in_a_fresh_venv_trains_against_a_hub(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lowest = _lowest(project["dependencies"])
    assert any(p.startswith("numpy==") and p != f"numpy=={numpy.__version__}" for p in lowest)
    wheel = build_wheel(ROOT, tmp_path)
    env_dir = tmp_path / "venv"
    py = fresh_venv(env_dir)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    uv_pip(py, "install", ["-q", wheel, *lowest], clean, timeout=600)
    installed = uv_pip(py, "freeze", [], clean).lower()
    for hub_only in ("duckdb", "uvicorn", "starlette", "psycopg", "protobuf", "pyyaml", "psutil"):
        assert f"\n{hub_only}==" not in f"\n{installed}", f"the SDK install pulled in {hub_only}"

    hub = HubProcess(tmp_path, free_port(), tmp_path / "hub.duckdb")  # the hub runs on this venv's numpy
    try:
        hub.wait_ready()
        done = subprocess.run(
            [py, "-c", TRAIN, hub.url, str(tmp_path / "state")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,  # not the worktree: the venv must import the installed wheel
            env=clean,
        )
        assert done.returncode == 0, done.stderr
        sdk_file, sdk_numpy = done.stdout.strip().splitlines()[-2:]
        assert Path(sdk_file).is_relative_to(env_dir), sdk_file
        assert sdk_numpy != numpy.__version__ and f"numpy=={sdk_numpy}" in lowest
        rows = records(hub.url, "venv-sdk")
        assert [r["step"] for r in rows] == list(range(6))
        assert rows[-1]["metrics"]["loss"] == pytest.approx(1 / 13)
        assert events(hub.url, "venv-sdk", "job_ended")
    finally:
        hub.close()
