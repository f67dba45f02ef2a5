"""A real small disk: an 8 MiB tmpfs mounted for one test (needs root, as CI runs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"a tmpfs is needed for the disk-full tests and CI runs as root: {reason}")
    pytest.skip(f"disk-full tests mount a tmpfs: {reason}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB filesystem of its own, so filling it fills nothing else."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        _unavailable("not running as root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        _unavailable(f"mount refused: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the disk is full; deleting it gives the space back."""
    filler = disk / "filler"
    f = filler.open("wb")
    try:
        while True:
            f.write(b"\0" * 65_536)
            f.flush()
    except OSError:
        pass
    finally:
        # the bytes that did not fit stay buffered and raise ENOSPC again on close
        with contextlib.suppress(OSError):
            f.close()
    return filler
