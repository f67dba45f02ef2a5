"""A hub's alert history in memory is bounded; what it forgets stays in the store and is counted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuscope.alert.engine import AlertEngine
from gpuscope.alert.state import LocalAlertState
from gpuscope.counters import Counters
from gpuscope.model import Finding
from gpuscope.store.duckdb import DuckDBStore


def throttle(node: int) -> Finding:
    entity = {"node": f"node-{node}", "gpu": "0"}
    return Finding("gpu_thermal_throttle", entity, f"throttling on node-{node}")


@pytest.fixture
def store() -> Iterator[DuckDBStore]:
    with DuckDBStore(":memory:") as s:
        yield s


def test_a_flapping_fleet_keeps_at_most_keep_alerts_in_memory_and_every_alert_in_the_store(
    store: DuckDBStore,
) -> None:
    counters = Counters()
    # ten times as many alerts as are kept: each one is stored as it fires, which is most of the time
    engine = AlertEngine(resolve_after=0.0, state=LocalAlertState(store, keep=60, counters=counters))
    for i in range(600):  # a GPU somewhere fires and clears every 10 s, for 100 minutes
        engine.update(i * 10.0, [throttle(i % 7)])
        engine.update(i * 10.0 + 1, [])
    held = engine.all()
    assert 0 < len(held) <= 60
    assert counters.get("alerts_forgotten") == 600 - len(held)
    assert held[-1].id == "al-600" and [a.id for a in held] == sorted(
        (a.id for a in held), key=lambda x: int(x[3:])
    )
    incidents = engine.incidents()
    assert 0 < len(incidents) <= len(held)
    assert {m for i in incidents for m in i.members} == {a.id for a in held}
    assert len(store.alerts(limit=10_000)) == 600  # forgotten in memory, not lost


def test_firing_alerts_are_never_forgotten(store: DuckDBStore) -> None:
    counters = Counters()
    engine = AlertEngine(resolve_after=0.0, state=LocalAlertState(store, keep=20, counters=counters))
    stuck = [throttle(1000 + n) for n in range(50)]  # 50 GPUs throttle throughout
    for i in range(300):
        engine.update(i * 10.0, [*stuck, throttle(i % 5)])
        engine.update(i * 10.0 + 1, stuck)
    firing = {a.id for a in engine.firing()}
    assert len(firing) == 50 and firing <= {a.id for a in engine.all()}
    assert counters.get("alerts_forgotten") == 350 - len(engine.all()) > 0


def test_an_incident_that_ended_recently_is_kept_and_still_takes_a_related_alert(store: DuckDBStore) -> None:
    counters = Counters()
    state = LocalAlertState(store, keep=10, counters=counters)
    engine = AlertEngine(resolve_after=0.0, state=state)
    for i in range(40):  # distinct nodes, one short alert every 20 s
        engine.update(i * 20.0, [throttle(i)])
        engine.update(i * 20.0 + 1, [])
    assert counters.get("alerts_forgotten") > 0
    recent = next(a for a in engine.all() if a.entity["node"] == "node-37")  # ended 60 s ago
    engine.update(40 * 20.0, [throttle(37)])
    again = engine.all()[-1]
    assert again.entity["node"] == "node-37" and again.id != recent.id
    assert again.incident == recent.incident  # joined the ended incident it reopens


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep"):
        LocalAlertState(None, keep=0)


def test_a_firing_alert_is_listed_as_its_last_evaluation_left_it_not_as_it_fired(store: DuckDBStore) -> None:
    # the API lists alerts from here: a straggler that slowed further, a hub that has refused
    # 140,000 requests since it fell behind, must not read as they did when they fired
    state = LocalAlertState(store)
    engine = AlertEngine(resolve_after=5.0, state=state)
    entity = {"job": "job-1", "rank": "3"}
    engine.update(0.0, [Finding("training_straggler", entity, "rank 3 is 1.3x its peers", value=1.3)])
    engine.update(10.0, [Finding("training_straggler", entity, "rank 3 is 4.0x its peers", value=4.0)])
    (listed,) = state.alerts()
    assert listed.firing and listed.value == 4.0 and listed.summary == "rank 3 is 4.0x its peers"
    (firing,) = state.alerts(firing_only=True)
    assert firing.value == 4.0
    engine.update(20.0, [])
    (resolved,) = state.alerts()
    assert not resolved.firing and resolved.value == 4.0
    # what the store holds on its own (after a restart) is the same alert at its last transition
    (stored,) = store.alerts()
    assert stored.id == listed.id and stored.value == 4.0 and not stored.firing
