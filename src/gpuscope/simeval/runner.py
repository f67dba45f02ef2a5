"""Runs a scenario through the hub's own ingest, detect and alert code in virtual time.

Every batch the simulator produces is encoded to the wire format and decoded again, exactly as
the HTTP ingest path does, so a wire-format or validation bug shows up here too; only the socket
is skipped. Detection is evaluated after every tick at the tick's simulated time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscope.alert.engine import WORSENED
from gpuscope.ingest.payload import batch_to_json, parse_batch
from gpuscope.model import Alert, Batch
from gpuscope.runtime import evaluation_hub
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import Scenario
from gpuscope.store.duckdb import DuckDBStore

ProgressCallback = Callable[[float, float], None]


@dataclass(slots=True)
class RunResult:
    scenario: Scenario
    alerts: list[Alert]
    wall_seconds: float
    ticks: int
    samples: int
    stats: dict[str, Any] = field(default_factory=dict)
    #: GPU-hours per state: as the hub's productivity model measured them, and the simulator's truth
    measured_gpu_hours: dict[str, float] = field(default_factory=dict)
    true_gpu_hours: dict[str, float] = field(default_factory=dict)
    #: per rule: how long after an entity's first report the detectors only learn its baseline
    learns_first: dict[str, float] = field(default_factory=dict)
    #: the alerts as they were told (:func:`notices`): what the document lists and the report scores
    told: list[Alert] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.scenario.duration / self.wall_seconds if self.wall_seconds > 0 else float("inf")


def _through_wire(batch: Batch) -> Batch:
    return parse_batch(batch_to_json(batch))


def run_scenario(
    scenario: Scenario, *, progress: ProgressCallback | None = None, wire: bool = True
) -> RunResult:
    """Simulate ``scenario`` and return every alert raised, with times in simulated seconds."""
    store = DuckDBStore(":memory:", durable=False)
    hub = evaluation_hub(store, scenario.cluster.price_per_gpu_hour)  # the runtime's detection side
    started = time.perf_counter()
    ticks = samples = 0
    sim = Simulator(scenario, t0=0.0)
    try:
        for tick in sim.ticks():
            for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
                result = hub.ingest(_through_wire(batch) if wire else batch)
                samples += result.samples
            hub.evaluate(tick.t)
            ticks += 1
            if progress is not None and ticks % 60 == 0:
                progress(tick.t, scenario.duration)
        hub.evaluate(float(scenario.duration))
        alerts = sorted(hub.alerts.all(), key=lambda a: (a.started_at, a.id))
        stats = {"counters": hub.counters.snapshot()}
        measured = hub.productivity.gpu_hours(0.0, float(scenario.duration))
    finally:
        store.close()
    wall = time.perf_counter() - started
    truth = sim.truth.gpu_hours()
    return RunResult(
        scenario,
        alerts,
        wall,
        ticks,
        samples,
        stats,
        measured,
        truth,
        hub.detection.learns_first(),
        notices(alerts),
    )


def notices(alerts: list[Alert]) -> list[Alert]:
    """The alerts as they were told: each alert, then each of its escalations as a notice of its
    own: the same alert (rule, entity, incident, resolution) starting when it escalated, at the
    tier, value and summary it escalated to, its ``details["worsening_of"]`` the alert's id. A
    second cause inside an open alert is told as its own start, so a reader that matches alerts to
    causes by their start (the sim-eval documents, their scorers) sees it. Applied once, to the
    alerts of the alert engine (its escalations in ``details["worsened"]``), before the document is
    written and the run is scored."""
    out: list[Alert] = []
    for alert in alerts:
        out.append(alert)
        for i, told in enumerate(alert.details.get(WORSENED, ()), 1):
            out.append(
                replace(
                    alert,
                    id=f"{alert.id}.{i}",
                    severity=str(told["severity"]),
                    started_at=float(told["at"]),
                    summary=str(told["summary"]),
                    value=told["value"],
                    details={"worsening_of": alert.id, "stage": told["stage"]},
                )
            )
    return sorted(out, key=lambda a: a.started_at)


def alerts_json(result: RunResult) -> dict[str, Any]:
    """The output contract of DESIGN §5 (``sim-eval --json``)."""
    return alerts_document(result.scenario.name, result.scenario.duration, result.told)


def alerts_document(name: str, seconds: float, told: list[Alert]) -> dict[str, Any]:
    """DESIGN §5's alerts document for a run called ``name`` over ``seconds`` of its own time,
    listing the alerts as they were ``told`` (:func:`notices`): an alert that escalated while it
    fired (a graver tier, or a second cause that made it materially worse) is listed once more per
    escalation, starting when it escalated, with ``worsening_of``: the start of the alert it
    continues."""
    started = {a.id: a.started_at for a in told}
    rows: list[dict[str, Any]] = []
    for a in told:
        row = {
            "rule": a.rule,
            "severity": a.severity,
            "started_at": round(a.started_at, 3),
            "resolved_at": None if a.resolved_at is None else round(a.resolved_at, 3),
            "entity": a.entity,
            "summary": a.summary,
            "incident": a.incident,
            "cost_per_hour": round(a.cost_per_hour, 2),
        }
        if "worsening_of" in a.details:
            row["worsening_of"] = round(started[a.details["worsening_of"]], 3)
        rows.append(row)
    return {"scenario": name, "simulated_seconds": seconds, "alerts": rows}
