"""A pytest plugin for tests/test_suite_marks.py: once collection is done (marks added, modules
sorted), print each test in run order with whether it is marked ``integration``."""

from __future__ import annotations

import pytest

PREFIX = "suite-probe:"


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        marked = item.get_closest_marker("integration") is not None
        print(f"{PREFIX} {item.nodeid} {'integration' if marked else 'plain'}")
