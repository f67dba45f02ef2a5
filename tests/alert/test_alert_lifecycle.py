"""Pending → firing → resolved, hard faults never pending, and service alerts linked to their nodes."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.alert.engine import AlertEngine
from gpuscope.alert.ranking import rank_alerts
from gpuscope.alert.topology import placements
from gpuscope.model import Batch, Finding, Frame
from gpuscope.store.duckdb import DuckDBStore


def plateau() -> Finding:
    return Finding("loss_plateau", {"job": "llm"}, "loss flat", affected_gpus=8)


def test_a_pending_rule_fires_only_after_holding_for_its_time_and_starts_when_it_fired() -> None:
    engine = AlertEngine(resolve_after=0.0, pending_for={"loss_plateau": 60.0})
    assert engine.update(0.0, [plateau()]) == []
    assert engine.pending()[0]["since"] == 0.0 and engine.all() == []
    assert engine.update(30.0, []) == [] and engine.pending() == [] and engine.pending_cleared == 1
    engine.update(40.0, [plateau()])
    assert engine.update(99.0, [plateau()]) == []
    (change,) = engine.update(100.0, [plateau()])
    assert change.kind == "fired" and change.alert.started_at == 100.0
    assert change.alert.details["pending_since"] == 40.0
    engine.update(101.0, [Finding("loss_plateau", {"job": "llm"}, "flat", details={"x": 1})])
    assert change.alert.details == {"x": 1, "pending_since": 40.0}  # kept across refreshes


def test_hard_faults_cannot_be_made_to_wait() -> None:
    for rule in ("gpu_xid_fatal", "gpu_ecc_uncorrectable", "gpu_lost", "node_unreachable", "rank_lost"):
        with pytest.raises(ValueError, match="hard fault"):
            AlertEngine(pending_for={rule: 5.0})
    engine = AlertEngine(pending_for={"gpu_lost": 0.0})
    (change,) = engine.update(7.0, [Finding("gpu_lost", {"node": "n", "gpu": "0"}, "lost")])
    assert change.alert.started_at == 7.0


def test_a_latency_regression_joins_network_errors_on_the_nodes_its_service_runs_on() -> None:
    store = DuckDBStore(":memory:", durable=False)
    try:
        frame = Frame(
            100.0,
            ["inference_requests_per_second"],
            [{"service": "chat", "model": "m", "version": "v1", "node": "node-3"}],
            np.array([[40.0]]),
        )
        store.append(Batch("test", frames=[frame]))
        assert placements(store, {"service": "chat"}) == [{"node": "node-3"}]
        engine = AlertEngine(resolve_after=0.0, places=lambda e: placements(store, e))
        engine.update(100.0, [Finding("network_degraded", {"node": "node-3"}, "IB errors")])
        engine.update(
            130.0,
            [
                Finding("network_degraded", {"node": "node-3"}, "IB errors"),
                Finding("inference_latency_regression", {"service": "chat"}, "p99 up", affected_gpus=4),
                Finding("inference_latency_regression", {"service": "other"}, "p99 up"),
            ],
        )
        net, chat, other = engine.all()
        assert chat.incident == net.incident != other.incident
        incident = next(i for i in engine.incidents() if i.id == net.incident)
        assert incident.root == net.id  # the node is below the service: it is the root cause
        ranked = rank_alerts(engine.all())
        assert ranked[0].rule == "inference_latency_regression" and ranked[0].cost_per_hour == 5.0
    finally:
        store.close()
