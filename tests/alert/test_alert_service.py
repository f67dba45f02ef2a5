"""The alerting service on a simulated cluster: one incident rooted at the lost GPU, playbooks that ran."""

from __future__ import annotations

from pathlib import Path

from alert.sink import Clock, Sink
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.hub import Hub
from gpuscope.ingest.payload import batch_to_json, parse_batch
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import load_scenario
from gpuscope.store.duckdb import DuckDBStore

SCENARIO = Path(__file__).parent / "fixtures" / "gpu_lost_small.yaml"


def test_a_lost_gpu_its_rank_and_the_stalled_job_are_one_incident_with_the_stall_diagnosed(
    sink: Sink,
) -> None:
    scenario = load_scenario(SCENARIO)
    store = DuckDBStore(":memory:", durable=False)
    hub = Hub(store, price_per_gpu_hour=scenario.cluster.price_per_gpu_hour)
    clock = Clock(0.0)
    cfg = {
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
        "routes": [{"receiver": "hook", "group_interval": "10s"}],
    }
    service = AlertingService(hub, parse_alerting(cfg), clock=clock)
    try:
        for tick in Simulator(scenario, t0=0.0).ticks():
            clock.t = tick.t
            for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
                hub.ingest(parse_batch(batch_to_json(batch)))
            hub.evaluate(tick.t)
            assert service.drain(10.0)
            service.tick()
            service.outbox.deliver_due()
        alerts = {a.rule: a for a in hub.alerts.all()}
        assert {"gpu_lost", "rank_lost", "training_stalled"} <= set(alerts)
        incidents = {a.incident for a in alerts.values()}
        assert len(incidents) == 1
        (incident,) = hub.alerts.incidents()
        assert incident.root == alerts["gpu_lost"].id and incident.title.startswith(
            "gpu_lost on node-0 GPU 1"
        )

        book = alerts["training_stalled"].details["playbook"]
        assert book["meaning"].startswith("The job's step counter") and book["mitigation"]
        steps = {s.get("check"): s for s in book["diagnosis"]}
        util = steps["job_gpu_utilization"]
        assert util["status"] == "found" and util["data"]["gpus"] == 8 and util["data"]["busy"] is True
        ckpt = steps["last_checkpoint"]
        assert ckpt["status"] == "found" and 0 < ckpt["data"]["seconds_since"] < 130  # checkpoint every 120 s
        near = steps["faults_nearby"]
        assert near["status"] == "found" and "gpu_lost" in near["result"] and "node-0" in near["result"]
        first = steps["first_stopped_rank"]
        assert first["status"] == "found" and first["data"]["rank"] == 1 and first["data"]["gpu"] == "1"
        assert "likely root cause" in book["summary"]
        # Persisted with the alert (the store's copy is what the API and CLI show).
        stored = {a.id: a for a in store.alerts()}[alerts["training_stalled"].id]
        assert stored.details["playbook"]["summary"] == book["summary"]
        # The receiver heard one group (the incident) fire and later resolve, with the diagnosis attached.
        bodies = sink.bodies("/hook")
        assert bodies[0]["status"] == "firing" and bodies[0]["groupLabels"] == {"incident": incident.id}
        fired = {a["labels"]["alertname"] for b in bodies for a in b["alerts"] if a["status"] == "firing"}
        assert fired == {"gpu_lost", "rank_lost", "training_stalled"}
        stall = next(a for b in bodies for a in b["alerts"] if a["labels"]["alertname"] == "training_stalled")
        assert "likely root cause" in stall["annotations"]["diagnosis"]
        assert bodies[-1]["status"] == "resolved" and len(bodies[-1]["alerts"]) == 3
    finally:
        service.db.close()
        store.close()
