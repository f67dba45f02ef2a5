"""The serving hub's garbage collector: what start-up built is frozen before it serves, young
collections wait longer, and cyclic garbage made while serving is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuscope import gcpolicy
from gpuscope.config import load_config
from gpuscope.runtime import assemble
from support import free_port


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, whatever the test froze or changed."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_tuning_freezes_what_is_alive_and_still_collects_later_cycles(collector: None) -> None:
    alive = [Node() for _ in range(1000)]
    frozen = gcpolicy.tune_for_serving()
    assert frozen >= len(alive)
    # frozen objects that die later leave the count (another test's thread in this worker can drop
    # some between the two readings); none is added
    assert len(alive) <= gc.get_freeze_count() <= frozen
    assert gc.get_threshold()[0] == gcpolicy.YOUNG_THRESHOLD
    # what start-up left alive is not scanned by a full collection any more
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in tracked for node in alive)
    # a cycle made while serving becomes garbage and is collected, not kept for good
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_the_serving_hub_tunes_its_collector_after_start_up_and_before_it_serves(
    tmp_path: Path, collector: None
) -> None:
    cfg_path = tmp_path / "hub.yaml"
    storage = {"path": str(tmp_path / "hub.duckdb")}
    cfg_path.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{free_port()}", "storage": storage}))
    runtime = assemble(load_config(cfg_path), evaluate_interval=0.1)
    assert runtime.server is not None and runtime.evaluator is not None
    seen: dict[str, object] = {}

    def serve() -> None:  # the HTTP server's loop, replaced: what it finds when it would start
        assert runtime.evaluator is not None
        seen["frozen"] = gc.get_freeze_count()
        seen["young"] = gc.get_threshold()[0]
        seen["evaluating"] = runtime.evaluator.is_alive()

    gc.unfreeze()
    runtime.server.run = serve  # type: ignore[method-assign]
    runtime.run()
    assert seen["evaluating"] is True  # start-up (warm-up, alerting, the clock) came first
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 0
    assert seen["young"] == gcpolicy.YOUNG_THRESHOLD
