"""Fixtures of the agent tests: a virtual clock and a fake hub."""

from __future__ import annotations

import pytest

from agent.fakes import FakeClock, FakeHub


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hub() -> FakeHub:
    return FakeHub()
