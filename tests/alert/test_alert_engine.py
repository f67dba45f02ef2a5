"""AlertEngine: one alert per (rule, entity), resolve after a short absence, tiers, owners, cost."""

from __future__ import annotations

import pytest

from gpuscope.alert.engine import AlertEngine
from gpuscope.model import Finding
from gpuscope.simeval.runner import alerts_document, notices

GPU = {"node": "node-1", "gpu": "3"}


def lost(**kw: object) -> Finding:
    return Finding("gpu_lost", dict(GPU), "GPU 3 on node-1 is lost", **kw)  # type: ignore[arg-type]


def test_fires_once_refreshes_and_resolves_after_the_absence_window() -> None:
    engine = AlertEngine(resolve_after=3.0)
    changes = engine.update(10.0, [lost(value=1.0)])
    assert [(c.kind, c.alert.id) for c in changes] == [("fired", "al-1")]
    alert = changes[0].alert
    assert (alert.rule, alert.severity, alert.owner, alert.entity, alert.started_at) == (
        "gpu_lost",
        "P1",
        "platform",
        GPU,
        10.0,
    )
    assert engine.update(11.0, [lost(value=2.0, details={"k": 1})]) == []
    assert alert.value == 2.0 and alert.details == {"k": 1} and alert.last_seen == 11.0
    assert engine.update(12.0, []) == [] and engine.update(13.0, []) == []  # absent 2 s: not yet
    assert engine.update(13.5, [lost()]) == []  # back before the window closed: the same alert
    assert engine.update(16.0, []) == []
    changes = engine.update(16.5, [])
    assert [(c.kind, c.alert.id) for c in changes] == [("resolved", "al-1")]
    assert alert.resolved_at == 16.5 and not alert.firing and engine.firing() == []


def test_a_recurrence_after_resolution_is_a_new_alert() -> None:
    engine = AlertEngine(resolve_after=0.0)
    engine.update(1.0, [lost()])
    engine.update(2.0, [])
    changes = engine.update(3.0, [lost()])
    assert [(c.kind, c.alert.id) for c in changes] == [("fired", "al-2")]
    assert [a.id for a in engine.all()] == ["al-1", "al-2"] and [a.id for a in engine.firing()] == ["al-2"]


def test_entities_and_rules_are_distinct_alerts() -> None:
    engine = AlertEngine()
    changes = engine.update(
        1.0,
        [
            lost(),
            Finding("gpu_lost", {"node": "node-1", "gpu": "4"}, "other GPU"),
            Finding("gpu_xid_fatal", dict(GPU), "XID 79"),
            lost(),  # a duplicate in the same evaluation is the same alert
        ],
    )
    assert [c.alert.id for c in changes] == ["al-1", "al-2", "al-3"]
    assert len(engine.firing()) == 3


def test_cost_per_hour_is_gpus_times_price_times_work_at_risk() -> None:
    engine = AlertEngine(price_per_gpu_hour=3.0)
    engine.update(
        0.0,
        [
            Finding("training_stalled", {"job": "llm"}, "stalled", affected_gpus=64),
            Finding("gpu_thermal_throttle", dict(GPU), "hot"),
            Finding("gpu_ecc_correctable_rising", dict(GPU), "sbe", affected_gpus=1),
        ],
    )
    costs = {a.rule: a.cost_per_hour for a in engine.all()}
    assert costs == {
        "training_stalled": 64 * 3.0,
        "gpu_thermal_throttle": pytest.approx(3.0 * 0.3),
        "gpu_ecc_correctable_rising": pytest.approx(3.0 * 0.05),
    }
    assert [a.severity for a in engine.all()] == ["P1", "P2", "P3"]


def test_non_finite_values_are_stored_as_none() -> None:
    engine = AlertEngine()
    engine.update(0.0, [lost(value=float("nan"))])
    assert engine.all()[0].value is None
    assert engine.all()[0].to_dict()["value"] is None


@pytest.mark.parametrize(
    ("finding", "message"),
    [
        (Finding("no_such_rule", dict(GPU), "x"), "not in the alert catalog"),
        (Finding("gpu_lost", {}, "x"), "entity"),
        (Finding("gpu_lost", {"node": 1}, "x"), "entity"),  # type: ignore[dict-item]
        (Finding("gpu_lost", dict(GPU), "x", affected_gpus=-1), "affected_gpus"),
    ],
)
def test_malformed_findings_are_refused_with_a_clear_error(finding: Finding, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AlertEngine().update(0.0, [finding])


def test_bad_settings_and_times_are_refused() -> None:
    with pytest.raises(ValueError, match="price_per_gpu_hour"):
        AlertEngine(price_per_gpu_hour=-1)
    with pytest.raises(ValueError, match="resolve_after"):
        AlertEngine(resolve_after=float("inf"))
    with pytest.raises(ValueError, match="finite"):
        AlertEngine().update(float("nan"), [])


def slower(value: float, stage: int = 0, severity: str | None = None) -> Finding:
    return Finding(
        "step_time_regression",
        {"job": "j"},
        f"Step time of job j rose {value - 1:+.0%}",
        value=value,
        stage=stage,
        severity=severity,
    )


def test_a_worsening_inside_an_open_alert_escalates_it_and_is_recorded() -> None:
    engine = AlertEngine(resolve_after=5.0)
    (fired,) = engine.update(10.0, [slower(1.2)])
    alert = fired.alert
    assert engine.update(11.0, [slower(1.25)]) == []  # the value follows; no new stage: no change
    assert alert.value == 1.25 and "+25%" in alert.summary
    changes = engine.update(20.0, [slower(2.2, stage=1)])
    assert [(c.kind, c.alert.id) for c in changes] == [("escalated", alert.id)]
    assert alert.value == 2.2 and "+120%" in alert.summary and alert.severity == "P2"
    assert engine.update(21.0, [slower(2.1, stage=1)]) == []  # the same stage is told once
    (told,) = alert.details["worsened"]
    assert (told["at"], told["from"], told["severity"], told["value"], told["stage"]) == (
        20.0,
        "P2",
        "P2",
        2.2,
        1,
    )
    changes = engine.update(30.0, [slower(2.3, stage=1, severity="P1")])  # a tier crossed
    assert [c.kind for c in changes] == ["escalated"] and alert.severity == "P1"
    assert [(w["at"], w["from"], w["severity"]) for w in alert.details["worsened"]] == [
        (20.0, "P2", "P2"),
        (30.0, "P2", "P1"),
    ]
    assert alert.details["escalated_from"] == "P2" and len(engine.all()) == 1


def test_an_alert_that_fires_at_a_later_stage_is_not_escalated_by_it() -> None:
    engine = AlertEngine(resolve_after=5.0)
    (fired,) = engine.update(10.0, [slower(2.0, stage=1)])
    assert engine.update(11.0, [slower(2.0, stage=1)]) == []
    assert [c.kind for c in engine.update(12.0, [slower(2.6, stage=2)])] == ["escalated"]
    assert fired.alert.details["worsened"][0]["stage"] == 2


def test_each_escalation_is_a_notice_of_its_own_in_the_sim_eval_document() -> None:
    engine = AlertEngine(resolve_after=0.0)
    engine.update(10.0, [slower(1.2)])
    engine.update(20.0, [slower(2.2, stage=1)])
    engine.update(30.0, [])
    (alert,) = engine.all()
    shown = notices(engine.all())
    assert [(a.started_at, a.value, a.resolved_at, a.details.get("worsening_of")) for a in shown] == [
        (10.0, 2.2, 30.0, None),
        (20.0, 2.2, 30.0, alert.id),
    ]
    doc = alerts_document("s", 60.0, shown)
    assert [(r["started_at"], r["resolved_at"], r.get("worsening_of")) for r in doc["alerts"]] == [
        (10.0, 30.0, None),
        (20.0, 30.0, 10.0),
    ]
    assert "+120%" in doc["alerts"][1]["summary"]
