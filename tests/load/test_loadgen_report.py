"""The load generator's report on a hub that also holds senders it did not play."""

from __future__ import annotations

import io

from rich.console import Console

from gpuscope.loadgen import FleetShape, LoadOptions
from gpuscope.loadgen.cli import print_report
from gpuscope.loadgen.run import Detection, LoadReport
from gpuscope.loadgen.sender import SenderStats
from gpuscope.loadgen.traffic import ExpectedAlert
from gpuscope.sim.scenario import FaultSpec


def _alert(node: str, rule: str = "node_unreachable") -> dict[str, object]:
    return {"rule": rule, "severity": "P1", "entity": {"node": node}, "started_at": 100.0}


def _report(alerts: list[dict[str, object]], stats: SenderStats) -> LoadReport:
    fault = FaultSpec(0, 4.0, "node_down", {"node": "node-3"}, {})
    return LoadReport(
        options=LoadOptions(hubs=["http://127.0.0.1:7470"], shape=FleetShape(nodes=32), duration=10),
        t0=0.0,
        stats=stats,
        detections=[Detection(ExpectedAlert(fault, "node_unreachable", 4.0))],
        hub_cores=0.1,
        hub_cpu_seconds=1.0,
        hub_cpu_p95=0.2,
        hub_rss_peak=1,
        hub_rss_end=1,
        generator_cores=0.1,
        dispatch_late_max=0.0,
        health=[],
        alerts=alerts,
        poll_errors=0,
        machine_cores_busy=1.0,
        load_average=(1.0, 1.0),
    )


def test_alerts_on_nodes_not_named_node_n_are_reported_not_a_traceback() -> None:
    stats = SenderStats(batches_offered=10, batches_acked=10)
    alerts = [_alert("dgx-a01"), _alert("gpu7"), _alert("node-x"), _alert("node-3"), _alert("node-12")]
    report = _report(alerts, stats)
    # node-3 carries the fault and node-12 runs the same job (16 nodes a job); the others are unexplained
    unexplained = [a["entity"]["node"] for a in report.unexplained_alerts()]  # type: ignore[index]
    assert unexplained == ["dgx-a01", "gpu7", "node-x"]
    out = io.StringIO()
    print_report(report, "load", Console(file=out, width=200))
    assert "unexplained P1/P2 alerts" in out.getvalue()
    assert report.to_dict()["nodes"] == 32


def _overloaded(shed: int) -> dict[str, object]:
    """The hub's own alert as the soaks read it back: behind twice, 196 requests refused."""
    return {
        "rule": "hub_overloaded",
        "severity": "P2",
        "entity": {"hub": "vm:56391"},
        "started_at": 100.0,
        "details": {"shed_requests": shed, "episodes": 2, "delay_seconds": 0.716},
    }


def test_the_hubs_own_overload_that_the_senders_met_is_not_a_fleet_false_alarm() -> None:
    """Seen: the 2-hour soak's one "unexplained P1/P2" was the hub's hub_overloaded: it refused
    196 requests, and the load generator met exactly 196 HTTP 503s (the machine was starved by
    two other soaks), on an alert naming no node or job of the fleet."""
    stats = SenderStats(batches_offered=10, batches_acked=10, retries=197, http_errors={503: 196})
    report = _report([_overloaded(196), _alert("dgx-a01")], stats)
    assert [a["rule"] for a in report.overload_alerts()] == ["hub_overloaded"]
    assert [a["entity"] for a in report.unexplained_alerts()] == [{"node": "dgx-a01"}]
    row = next(r for r in report.rows() if r[0].startswith("hub_overloaded"))
    assert row[1] == "1 (shed 196; senders met 196 × 503)"
    assert report.to_dict()["hub_overloaded"][0]["shed_requests"] == 196


def test_an_overload_the_senders_never_met_stays_unexplained() -> None:
    quiet = SenderStats(batches_offered=10, batches_acked=10)
    report = _report([_overloaded(196)], quiet)
    assert report.overload_alerts() == []
    assert [a["rule"] for a in report.unexplained_alerts()] == ["hub_overloaded"]
    assert not any(r[0].startswith("hub_overloaded") for r in report.rows())
