"""Scoring a run against its scenario's labelled faults: recall, precision, time to detect.

A fault is detected when an alert of its rule, on its target, starts within the fault's window
after onset; an alert counts against precision when no fault explains it (neither as the
detection itself nor as a knock-on in the fault's blast radius: same node, or same job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscope.model import Alert
from gpuscope.sim.kinds import HARD_FAULTS, rule_for_fault
from gpuscope.sim.scenario import FaultSpec, Scenario

DEFAULT_WINDOW = 600.0
#: Slow-developing faults get longer to be noticed (seconds after onset).
WINDOWS: dict[str, float] = {
    "ecc_sbe_storm": 3600,
    "loss_plateau": 7200,
    "loss_divergence": 3600,
    "prediction_drift": 3600,
    "confidence_shift": 3600,
    "input_drift": 3600,
    "checkpoint_stop": 7200,
    "memory_fragmentation": 3600,
    "gpu_slow": 1800,
    "idle_allocation": 3600,
    "step_time_regression": 1800,
    "bad_version": 1800,
    "pcie_replay": 3600,
    "nvlink_errors": 1800,
    "network_degraded": 1200,
}
KNOCK_ON_GRACE = 900.0


@dataclass(slots=True)
class FaultOutcome:
    fault: FaultSpec
    rule: str
    alert_id: str | None
    time_to_detect: float | None
    #: why a missed fault could not be detected, where the detectors' own facts tell
    missed_because: str | None = None


@dataclass(slots=True)
class Report:
    outcomes: list[FaultOutcome]
    unexplained: list[Alert]
    alerts: int
    healthy_gpu_hours: float
    ttd_hard: list[float] = field(default_factory=list)

    @property
    def recall(self) -> float:
        if not self.outcomes:
            return 1.0
        return sum(o.alert_id is not None for o in self.outcomes) / len(self.outcomes)

    @property
    def precision(self) -> float:
        return (self.alerts - len(self.unexplained)) / self.alerts if self.alerts else 1.0

    @property
    def false_p1p2(self) -> list[Alert]:
        return [a for a in self.unexplained if a.severity in ("P1", "P2")]

    def false_per_1000_gpu_hours(self) -> float:
        if self.healthy_gpu_hours <= 0:
            return 0.0
        return 1000 * len(self.false_p1p2) / self.healthy_gpu_hours

    def percentile(self, q: float) -> float | None:
        if not self.ttd_hard:
            return None
        ordered = sorted(self.ttd_hard)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recall": self.recall,
            "precision": self.precision,
            "faults": [
                {
                    "kind": o.fault.kind,
                    "at": o.fault.at,
                    "target": o.fault.target,
                    "rule": o.rule,
                    "detected": o.alert_id is not None,
                    "time_to_detect": o.time_to_detect,
                    **({"missed_because": o.missed_because} if o.missed_because else {}),
                }
                for o in self.outcomes
            ],
            "unexplained_alerts": [a.to_dict() for a in self.unexplained],
            "false_p1p2_per_1000_gpu_hours": self.false_per_1000_gpu_hours(),
            "healthy_gpu_hours": self.healthy_gpu_hours,
            "hard_ttd_p50": self.percentile(0.5),
            "hard_ttd_p95": self.percentile(0.95),
        }


def _window(scenario: Scenario, fault: FaultSpec) -> float:
    if fault.kind in ("checkpoint_failure", "checkpoint_corrupt"):
        every = next(
            (
                j.checkpoint_every
                for j in scenario.jobs
                if j.name == fault.target.get("job") and j.checkpoint_every
            ),
            600.0,
        )
        return 2 * every + 300
    if fault.kind == "gpu_failure_risk":  # the point is to name the GPU before its fatal XID
        return float(fault.params["ramp"])
    return WINDOWS.get(fault.kind, DEFAULT_WINDOW)


def _matches(entity: dict[str, str], target: dict[str, Any]) -> bool:
    return all(str(entity.get(k)) == str(v) for k, v in target.items())


def _blast_radius(scenario: Scenario, fault: FaultSpec) -> tuple[set[str], set[str]]:
    """Nodes and jobs/services a fault can plausibly disturb."""
    target = fault.target
    nodes: set[str] = set()
    jobs: set[str] = set()
    job_nodes = {j.name: set(j.nodes) for j in scenario.jobs}
    if "node" in target:
        nodes.add(str(target["node"]))
    for key in ("job", "service"):
        if key in target:
            jobs.add(str(target[key]))
            nodes |= job_nodes.get(str(target[key]), set())
    for name, ns in job_nodes.items():
        if ns & nodes:
            jobs.add(name)
    return nodes, jobs


def _missed_because(
    scenario: Scenario, fault: FaultSpec, rule: str, learns_first: Mapping[str, float]
) -> str | None:
    """A fault its rule could not see: it began while the detectors still learned its service's
    baseline (``learns_first``, from the detectors themselves), or ended before they judged."""
    learning = learns_first.get(rule, 0.0)
    start = next((j.start for j in scenario.jobs if j.name == fault.service), None)
    if learning <= 0 or start is None:
        return None
    # the service's first report is at its start or later: a fault before this is surely unjudged
    judged_from = start + learning
    if fault.at >= judged_from:
        return None
    first = f"service {fault.service}'s first {learning:g} s only learn its baseline"
    if min(fault.end, scenario.duration) <= judged_from:
        return f"ended before any rule could judge it: {first}"
    return f"began while {first} (until {judged_from:g} s)"


def evaluate(
    scenario: Scenario, alerts: list[Alert], learns_first: Mapping[str, float] | None = None
) -> Report:
    """Score ``alerts``, as they were told (the sim-eval document's rows:
    :func:`~gpuscope.simeval.runner.notices`), against the faults of ``scenario``; ``learns_first``
    (the run's :meth:`~gpuscope.detect.engine.DetectionEngine.learns_first`) names why a fault was
    missed. An alert's escalations are notices of their own: a second cause inside an open alert is
    detected when it escalated it."""
    outcomes: list[FaultOutcome] = []
    used: set[str] = set()
    ttd_hard: list[float] = []
    for fault in scenario.faults:
        rule = rule_for_fault(fault.kind, fault.params)
        window_end = min(fault.at + _window(scenario, fault), scenario.duration)
        candidates = sorted(
            (a.started_at - fault.at, a.id)
            for a in alerts
            if a.rule == rule
            and _matches(a.entity, fault.target)
            and fault.at - 1 <= a.started_at <= window_end
        )
        if candidates:
            ttd, alert_id = candidates[0]
            used.add(alert_id)
            if fault.kind in HARD_FAULTS:
                ttd_hard.append(ttd)
            outcomes.append(FaultOutcome(fault, rule, alert_id, ttd))
        else:
            reason = _missed_because(scenario, fault, rule, learns_first or {})
            outcomes.append(FaultOutcome(fault, rule, None, None, reason))
    unexplained = []
    for alert in alerts:
        if alert.id in used:
            continue
        explained = False
        for fault in scenario.faults:
            nodes, jobs = _blast_radius(scenario, fault)
            end = fault.at + (fault.duration or scenario.duration) + KNOCK_ON_GRACE
            in_radius = (
                alert.entity.get("node") in nodes
                or alert.entity.get("job") in jobs
                or alert.entity.get("service") in jobs
            )
            if in_radius and fault.at - 1 <= alert.started_at <= end:
                explained = True
                break
        if not explained:
            unexplained.append(alert)
    gpus = scenario.cluster.nodes * scenario.cluster.gpus_per_node
    healthy_hours = gpus * scenario.duration / 3600 if not scenario.faults else 0.0
    return Report(outcomes, unexplained, len(alerts), healthy_hours, ttd_hard)
