"""Fixtures of the alerting tests: a loopback webhook sink, a manual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from alert.sink import Clock, Sink


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.down()


@pytest.fixture
def clock() -> Clock:
    return Clock()
