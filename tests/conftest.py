"""Shared fixtures: real hub processes on loopback ports, stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support import HubProcess


@pytest.fixture
def hub_factory(tmp_path: Path) -> Iterator[type[HubProcess]]:
    started: list[HubProcess] = []

    class Factory(HubProcess):
        def __init__(
            self, port: int, db: Path, extra: list[str] | None = None, env: dict[str, str] | None = None
        ) -> None:
            super().__init__(tmp_path, port, db, extra, env)
            started.append(self)

    yield Factory
    for hub in started:
        hub.close()
