"""A forward request's parts reach the owner's detectors in one pass: the same alerts fire, at the
same times, on the same entities, as when each part was detected alone."""

from __future__ import annotations

from gpuscope.hub import Hub
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore

T0 = 1_700_000_000.0


def _alerts(hub: Hub) -> list[tuple[str, tuple[tuple[str, str], ...], float, float | None]]:
    return sorted(
        (a.rule, tuple(sorted(a.entity.items())), a.started_at, a.resolved_at) for a in hub.alerts.all()
    )


def test_parts_detected_together_raise_the_alerts_they_raise_one_by_one() -> None:
    shape = FleetShape(nodes=8, gpus_per_node=4, job_nodes=4)
    scenario = build_scenario(shape, 180.0)
    alone = Hub(DuckDBStore(":memory:", durable=False))
    together = Hub(DuckDBStore(":memory:", durable=False))
    for tick in Simulator(scenario, t0=T0).ticks():
        batches: list[Batch] = [*tick.node_batches.values(), *tick.sdk_batches]
        for batch in batches:
            alone.observe_local(batch)
        together.observe_local_many(batches)
        alone.evaluate(tick.t)
        together.evaluate(tick.t)
    fired = _alerts(alone)
    rules = {rule for rule, *_ in fired}
    assert {"gpu_xid_fatal", "gpu_lost", "node_unreachable", "training_stalled"} <= rules
    assert _alerts(together) == fired
