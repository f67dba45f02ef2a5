"""Shared fixtures: real hub processes on loopback ports, stopped after each test; and the
``integration`` mark for every test that uses a fixture starting a real process or server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgserver import PostgresServer, postgres_bin_dir
from support import HubProcess

#: Fixtures that start real processes or servers (hubs, PostgreSQL, TSDBs): a test using one, even
#: through another fixture, is an integration test, which ``make check`` leaves out.
PROCESS_FIXTURES = frozenset({"hub_factory", "postgres_server", "sdk_hub", "tsdb"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    # The longest modules run first, then those with integration tests (often a single long test
    # each): a long module dealt out last keeps one worker busy alone at the end. (The Makefile
    # turns off xdist's own reordering, which deals the modules with the most tests first.)
    long = {item.path for item in items if item.get_closest_marker("long") is not None}
    heavy = {item.path for item in items if item.get_closest_marker("integration") is not None}
    items.sort(key=lambda item: (item.path not in long, item.path not in heavy))


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (Debian package ``postgresql``)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL is not installed: scripts/system-deps.sh should have installed it")
        pytest.skip("PostgreSQL (Debian package postgresql) is not installed")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN to a fresh, empty database of its own for each test."""
    return postgres_server.create_database()
