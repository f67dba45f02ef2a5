"""The collector seam: registry, construction from context, failure isolation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest

from gpuscope.collect.base import (
    COLLECTORS,
    Collected,
    Collector,
    CollectorContext,
    CollectorError,
    CollectorSet,
    build_collectors,
    load_collectors,
    register_collector,
)
from gpuscope.collect.host import HostCollector
from gpuscope.counters import Counters
from gpuscope.model import Event, Frame


class Constant(Collector):
    name: ClassVar[str] = "constant"

    def collect(self, now: float) -> Collected:
        frame = Frame(now, ["node_load1"], [{"node": self.node}], np.array([[1.5]]))
        return Collected(frames=[frame], events=[Event(now, "heartbeat", {"node": self.node})])


class Broken(Collector):
    name: ClassVar[str] = "broken"
    closed = False

    def collect(self, now: float) -> Collected:
        raise RuntimeError("device vanished")

    def close(self) -> None:
        raise OSError("handle already gone")


@pytest.fixture
def registry() -> Iterator[None]:
    saved = dict(COLLECTORS)
    yield
    COLLECTORS.clear()
    COLLECTORS.update(saved)


def test_register_and_build_from_context(registry: None) -> None:
    register_collector(Constant)
    (c,) = build_collectors(["constant"], CollectorContext(node="n1", proc_root="/p", sys_root="/s"))
    assert isinstance(c, Constant)
    assert (c.node, c.proc_root, c.sys_root) == ("n1", "/p", "/s")


def test_registry_refuses_unnamed_and_clashing_collectors(registry: None) -> None:
    class Nameless(Collector):
        def collect(self, now: float) -> Collected:
            return Collected()

    with pytest.raises(TypeError, match="must set a non-empty class attribute 'name'"):
        register_collector(Nameless)

    class Impostor(Constant):
        pass

    register_collector(Constant)
    with pytest.raises(ValueError, match="'constant' is already registered by Constant"):
        register_collector(Impostor)


def test_unknown_collector_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown collector 'nvml2' \(registered: .*host"):
        build_collectors(["nvml2"], CollectorContext(node="n"))


def test_load_collectors_registers_every_module() -> None:
    assert load_collectors() == {}
    assert COLLECTORS["host"] is HostCollector


def test_one_failing_collector_does_not_stop_the_round(caplog: pytest.LogCaptureFixture) -> None:
    counters = Counters()
    cs = CollectorSet([Broken("n"), Constant("n")], counters)
    for t in (1.0, 2.0):
        got = cs.collect(t)
        assert [f.ts for f in got.frames] == [t]
        assert [e.kind for e in got.events] == ["heartbeat"]
        assert got.errors == [CollectorError("RuntimeError", "device vanished", collector="broken")]
    assert counters.snapshot() == {
        "collector_errors": 2,
        "collector_errors.broken": 2,
        "collector_errors.broken.RuntimeError": 2,
    }
    assert sum("device vanished" in r.getMessage() for r in caplog.records if r.levelname == "WARNING") == 1
    cs.close()  # a collector failing to close is counted, the others still close
    assert counters.get("collector_errors.broken.close") == 1


def test_the_same_collector_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="'constant' is given more than once"):
        CollectorSet([Constant("a"), Constant("b")])
