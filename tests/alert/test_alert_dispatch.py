"""Routing to real loopback receivers: firing, resolved, timing, silences, maintenance, flaps, escalation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from alert.rig import Rig, hot, lost
from alert.sink import Clock, Sink
from gpuscope.alert.ledger import Told
from gpuscope.model import Finding


def hook_cfg(sink: Sink, **route: object) -> dict[str, object]:
    return {
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
        "routes": [{"receiver": "hook", **route}],
    }


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        r.close()


def test_the_webhook_gets_firing_then_resolved_in_the_alertmanager_v4_payload(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    rig = Rig(hook_cfg(sink), clock)
    rigs.append(rig)
    rig.step(1, [lost()])
    (firing,) = sink.wait_for(1)
    assert firing["version"] == "4" and firing["status"] == "firing" and firing["receiver"] == "hook"
    (a,) = firing["alerts"]
    assert a["labels"] | {"node": "node-1", "gpu": "3"} == a["labels"]
    assert (a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["owner"]) == (
        "gpu_lost",
        "P1",
        "platform",
    )
    assert (
        a["endsAt"] == "0001-01-01T00:00:00Z" and a["startsAt"].endswith("Z") and len(a["fingerprint"]) == 16
    )
    assert (
        a["annotations"]["summary"] == "GPU 3 on node-1 is lost"
        and a["annotations"]["cost_per_hour"] == "2.50"
    )
    assert "fell off the bus" in a["annotations"]["meaning"]  # the playbook rides along
    assert (
        firing["groupLabels"] == {"incident": "inc-1"} and firing["commonLabels"]["alertname"] == "gpu_lost"
    )
    rig.step(1, [lost()])  # still firing: nothing new
    assert len(sink.bodies()) == 1
    rig.step(1, [])
    assert len(sink.bodies()) == 1  # a change to a sent group waits for group_interval (30 s)
    rig.step(30)
    resolved = sink.wait_for(2)[1]
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["status"] == "resolved"
    assert (
        resolved["alerts"][0]["fingerprint"] == a["fingerprint"]
        and resolved["alerts"][0]["endsAt"] != a["endsAt"]
    )
    history = [h["what"] for h in rig.service.history("al-1")]
    assert history == ["fired", "notified_firing", "resolved", "notified_resolved"]


def test_group_wait_group_interval_and_repeat_interval(sink: Sink, clock: Clock, rigs: list[Rig]) -> None:
    rig = Rig(
        hook_cfg(sink, group_by=["node"], group_wait="10s", group_interval="30s", repeat_interval="5m"), clock
    )
    rigs.append(rig)
    rig.step(1, [lost("3")])
    rig.step(5, [lost("3"), lost("4")])  # joins the group while it waits
    assert sink.bodies() == []
    rig.step(5, [lost("3"), lost("4")])  # group_wait is over: one notification with both
    (first,) = sink.wait_for(1)
    assert sorted(a["labels"]["gpu"] for a in first["alerts"]) == ["3", "4"]
    rig.step(5, [lost("3"), lost("4"), lost("5")])  # a new member waits for group_interval
    assert len(sink.bodies()) == 1
    for _ in range(5):
        rig.step(5)
    second = sink.wait_for(2)[1]
    assert sorted(a["labels"]["gpu"] for a in second["alerts"]) == ["3", "4", "5"]
    sent = len(sink.bodies())
    for _ in range(60):  # five minutes unchanged: one repeat
        rig.step(5)
    assert len(sink.bodies()) == sent + 1 and sink.bodies()[-1]["alerts"] == second["alerts"]


def test_a_silence_mutes_until_it_expires_then_the_still_firing_alert_is_sent(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    rig = Rig(hook_cfg(sink), clock)
    rigs.append(rig)
    from gpuscope.alert.labels import parse_matcher

    silence = rig.service.silence([parse_matcher("node=node-1")], 60, "ops", "reseating GPUs")
    rig.step(1, [lost(), hot(node="node-2")])
    assert [a["labels"]["node"] for b in sink.wait_for(1) for a in b["alerts"]] == ["node-2"]
    assert rig.service.status(rig.hub.alerts.get("al-1"))["muted"] == f"silenced by {silence.id}"  # type: ignore[arg-type]
    rig.step(30)
    assert len(sink.bodies()) == 1
    rig.step(31)  # expired while the GPU is still lost: now it is sent
    assert [a["labels"]["node"] for a in sink.wait_for(2)[1]["alerts"]] == ["node-1"]
    assert rig.hub.counters.get("notifications_muted") >= 1


def test_a_maintenance_window_keeps_planned_work_quiet(sink: Sink, clock: Clock, rigs: list[Rig]) -> None:
    cfg = hook_cfg(sink)
    cfg["alerting"] = {
        "maintenance": [
            {"name": "swap", "matchers": {"node": "node-1"}, "starts_at": clock.t, "ends_at": clock.t + 120}
        ]
    }
    rig = Rig(cfg, clock)
    rigs.append(rig)
    rig.step(1, [lost()])
    rig.step(60, [])  # fired and resolved inside the window: nobody is told
    rig.step(10, [lost("5")])
    assert sink.bodies() == []
    rig.step(60, [lost("5")])  # the window closed with GPU 5 still lost
    (body,) = sink.wait_for(1)
    assert [a["labels"]["gpu"] for a in body["alerts"]] == ["5"]


def test_a_flapping_alert_is_held_back_after_the_threshold(sink: Sink, clock: Clock, rigs: list[Rig]) -> None:
    cfg = hook_cfg(sink, group_interval="0s")
    cfg["alerting"] = {"flap": {"threshold": 3, "window": "10m"}}
    rig = Rig(cfg, clock)
    rigs.append(rig)
    for _ in range(6):
        rig.step(10, [hot()])
        rig.step(10, [])
    statuses = [b["status"] for b in sink.bodies()]
    assert statuses == ["firing", "resolved", "firing", "resolved"]  # the third fire is a flap
    assert len(rig.hub.alerts.all()) == 6  # every fire is still recorded
    rig.step(700, [hot()])  # quiet for longer than the window: notified again
    assert sink.wait_for(5)[-1]["status"] == "firing"


def test_an_unacknowledged_p1_escalates_and_an_ack_stops_it(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    cfg = {
        "receivers": [
            {"name": "hook", "webhook": {"url": f"{sink.url}/hook"}},
            {"name": "oncall-2", "pagerduty": {"routing_key": "rk", "url": f"{sink.url}/pd"}},
        ],
        "routes": [{"receiver": "hook", "repeat_interval": "1m"}],
        "alerting": {"escalation": [{"after": "5m", "receiver": "oncall-2"}]},
    }
    rig = Rig(cfg, clock)
    rigs.append(rig)
    rig.step(1, [lost("3"), lost("4", node="node-2"), hot(node="node-3")])
    for _ in range(5):
        rig.step(60)
    pages = sink.bodies("/pd")
    assert len(pages) == 2 and {p["event_action"] for p in pages} == {"trigger"}  # both P1s, not the P2
    assert (
        pages[0]["payload"]["severity"] == "critical"
        and pages[0]["payload"]["custom_details"]["escalation"] == 1
    )
    # Acknowledge one (by incident), then the other resolves: the pager hears the resolve.
    acked = rig.service.ack("inc-1", "alice", "on it")
    assert [a.id for a in acked] == ["al-1"] and rig.hub.alerts.get("al-1").details["ack"]["by"] == "alice"  # type: ignore[union-attr]
    hooks = len(sink.bodies("/hook"))
    rig.step(60, [lost("3"), hot(node="node-3")])
    pd = sink.bodies("/pd")
    assert len(pd) == 3 and pd[2]["event_action"] == "resolve" and pd[2]["dedup_key"] == pages[1]["dedup_key"]
    assert len(sink.bodies("/hook")) > hooks  # the resolve went to the routed receiver too
    cfg2 = dict(cfg, alerting={"escalation": [{"after": "1m", "receiver": "oncall-2"}]})
    rig2 = Rig(cfg2, Clock(clock.t + 10_000))
    rigs.append(rig2)
    rig2.step(1, [lost("7")])
    rig2.service.ack("al-1", "bob")
    rig2.step(120)
    assert len(sink.bodies("/pd")) == 3  # acknowledged before the deadline: no page
    with pytest.raises(KeyError):
        rig2.service.ack("al-99", "bob")


def test_pagerduty_and_slack_payloads(sink: Sink, clock: Clock, rigs: list[Rig]) -> None:
    cfg = {
        "receivers": [
            {"name": "pager", "pagerduty": {"routing_key": "rk-1", "url": f"{sink.url}/pd"}},
            {"name": "chat", "slack": {"url": f"{sink.url}/slack", "channel": "#gpu"}},
        ],
        "routes": [
            {"receiver": "pager", "match": {"severity": "P1"}, "continue": True, "group_interval": "0s"},
            {"receiver": "chat", "group_interval": "0s"},
        ],
    }
    rig = Rig(cfg, clock)
    rigs.append(rig)
    rig.step(1, [lost()])
    rig.step(1, [])
    trigger, resolve = sink.bodies("/pd")
    assert trigger["routing_key"] == "rk-1" and trigger["event_action"] == "trigger"
    assert trigger["payload"]["source"] == "gpu=3,node=node-1" and trigger["payload"]["class"] == "gpu_lost"
    assert resolve == {"routing_key": "rk-1", "dedup_key": trigger["dedup_key"], "event_action": "resolve"}
    fire_msg, resolve_msg = sink.bodies("/slack")
    assert fire_msg["channel"] == "#gpu" and fire_msg["text"].startswith("[FIRING] 1 firing")
    assert "*P1 gpu_lost* gpu=3 node=node-1 · $2/h" in fire_msg["attachments"][0]["text"]
    assert resolve_msg["text"].startswith("[RESOLVED] 0 firing, 1 resolved")


def risk(score: float, severity: str | None = None) -> Finding:
    return Finding(
        "gpu_failure_risk",
        {"node": "node-1", "gpu": "2"},
        f"node-1 GPU 2 failure risk {score:.2f}",
        value=score,
        severity=severity,
    )


def risk_told(sink: Sink, clock: Clock, rigs: list[Rig]) -> Rig:
    """A rig whose receiver was told a P3 failure risk fires."""
    rig = Rig(hook_cfg(sink, group_interval="30s"), clock)
    rigs.append(rig)
    rig.step(1, [risk(1.6)])
    (first,) = sink.wait_for(1)
    assert first["alerts"][0]["labels"]["severity"] == "P3"
    return rig


def test_an_alert_that_reaches_a_graver_tier_escalates_and_is_notified_again(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    rig = risk_told(sink, clock, rigs)
    rig.step(5, [risk(2.4)])  # worse, same tier: the alert follows, no new notification
    alert = rig.hub.alerts.get("al-1")
    assert alert is not None and alert.value == 2.4 and "2.40" in alert.summary and alert.severity == "P3"
    rig.step(5, [risk(3.5, "P2")])
    rig.step(30, [risk(3.5, "P2")])
    second = sink.wait_for(2)[1]
    (a,) = second["alerts"]
    assert (
        a["labels"]["severity"] == "P2" and a["status"] == "firing" and "3.50" in a["annotations"]["summary"]
    )
    assert alert.severity == "P2" and len(rig.hub.alerts.all()) == 1  # the same alert, escalated
    rig.step(5, [risk(2.0)])  # easing off never de-escalates
    assert alert.severity == "P2"
    history = [h["what"] for h in rig.service.history("al-1")]
    assert history[:3] == ["fired", "notified_firing", "escalated"] and history.count("notified_firing") == 2


def test_a_worsening_at_the_same_tier_is_notified_again_with_what_it_became(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    rig = risk_told(sink, clock, rigs)
    worse = risk(3.0)
    worse.stage = 1  # a second cause inside the open alert: not a graver tier, but materially worse
    rig.step(5, [worse])
    rig.step(30, [worse])
    (a,) = sink.wait_for(2)[1]["alerts"]
    assert (
        a["status"] == "firing" and a["labels"]["severity"] == "P3" and "3.00" in a["annotations"]["summary"]
    )
    rig.step(30, [worse])
    assert len(sink.bodies()) == 2  # told once per stage
    history = [(h["what"], h["detail"]) for h in rig.service.history("al-1")]
    assert ("escalated", "worse: node-1 GPU 2 failure risk 3.00") in history, history


def test_a_hub_continuing_another_hubs_alert_tells_only_what_the_ledger_says_was_not_told(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    """What a cluster member does when it takes over a shard (the ledger is PostgreSQL's there)."""
    first, told, untold = (Rig(hook_cfg(sink), clock) for _ in range(3))
    rigs.extend([first, told, untold])
    first.step(1, [lost()])
    sink.wait_for(1)
    (alert,) = first.hub.firing()
    told.hub.continue_alerts([alert], clock.t, 0.0)
    told.service.dispatcher.continued(alert, clock.t, Told({"hook": clock.t}))
    told.step(1, [lost()])
    assert len(sink.bodies()) == 1  # the receiver was told: not again
    told.step(1, [])
    told.step(30)  # its resolution waits for group_interval from the send the ledger recorded
    assert [b["status"] for b in sink.wait_for(2)] == ["firing", "resolved"]

    other = lost(gpu="5")
    first.step(1, [other])
    (alert,) = [a for a in first.hub.firing() if a.entity["gpu"] == "5"]
    untold.hub.continue_alerts([alert], clock.t, 0.0)
    untold.service.dispatcher.continued(alert, clock.t, Told())  # as if its owner died before sending
    untold.step(1, [other])
    assert [a["labels"]["gpu"] for a in sink.wait_for(4)[-1]["alerts"]] == ["5"]
    assert untold.service.dispatcher.forget(lambda entity: entity.get("gpu") == "5") == 1
    untold.step(31, [])
    assert len(sink.bodies()) == 4  # a forgotten alert is its new owner's to resolve


@pytest.mark.parametrize("group_by", [["incident"], ["..."]])
def test_an_alert_that_escalates_then_resolves_within_group_interval_is_told_resolved(
    sink: Sink, clock: Clock, rigs: list[Rig], group_by: list[str]
) -> None:
    """The receiver told it fires is owed its resolution, escalated or not (it was left firing),
    by one group, whether or not the escalation moved the alert to another group."""
    rig = Rig(hook_cfg(sink, group_by=group_by, group_interval="30s"), clock)
    rigs.append(rig)
    rig.step(1, [hot()])
    sink.wait_for(1)
    graver = hot()
    graver.severity = "P1"
    rig.step(5, [graver])  # escalated: told with the group's next changes, after group_interval
    rig.step(5, [])  # resolved first
    rig.step(30)
    bodies = sink.wait_for(2)
    assert [(x["status"], x["labels"]["severity"]) for b in bodies for x in b["alerts"]] == [
        ("firing", "P2"),
        ("resolved", "P1"),
    ]
    rig.step(60)
    assert len(sink.bodies()) == 2


@pytest.mark.parametrize("group_by", [["..."], ["severity"], ["node", "tier"], ["incident"]])
def test_an_escalated_alert_is_told_once_by_one_group_whatever_the_route_groups_by(
    sink: Sink, clock: Clock, rigs: list[Rig], group_by: list[str]
) -> None:
    """Grouped by a label the escalation changes (every label, or the tier named), the alert moves
    to its new group: told the graver tier once, by that group, with what its old group would have
    sent next (``group_interval`` after the receiver was told it fires), and resolved once."""
    rig = Rig(hook_cfg(sink, group_by=group_by, group_interval="30s"), clock)
    rigs.append(rig)
    rig.step(1, [hot()])
    (first,) = sink.wait_for(1)
    graver = hot()
    graver.severity = "P1"
    rig.step(5, [graver])
    assert len(sink.bodies()) == 1  # not at once: the receiver was told it fires 5 s ago
    rig.step(24, [graver])
    assert len(sink.bodies()) == 1
    rig.step(2, [graver])  # group_interval after the first notification
    second = sink.wait_for(2)[1]
    rig.step(60, [graver])
    rig.step(1, [])
    rig.step(30)
    rig.step(60)
    bodies = sink.bodies()
    told = [(b["groupKey"], x["status"], x["labels"]["severity"]) for b in bodies for x in b["alerts"]]
    assert told == [
        (first["groupKey"], "firing", "P2"),
        (second["groupKey"], "firing", "P1"),
        (second["groupKey"], "resolved", "P1"),
    ]
    history = [h["what"] for h in rig.service.history("al-1")]
    assert history.count("notified_firing") == 2 and history.count("notified_resolved") == 1


def test_an_alert_that_escalates_before_its_group_is_sent_is_told_once_no_later_than_it_would_have_been(
    sink: Sink, clock: Clock, rigs: list[Rig]
) -> None:
    rig = Rig(hook_cfg(sink, group_by=["..."], group_wait="30s"), clock)
    rigs.append(rig)
    rig.step(1, [hot()])
    graver = hot()
    graver.severity = "P1"
    rig.step(10, [graver])  # escalated within group_wait: nothing was told yet
    rig.step(19, [graver])
    assert sink.bodies() == []
    rig.step(1, [graver])  # the old group's group_wait is over: the new group tells it
    (told,) = sink.wait_for(1)
    assert [x["labels"]["severity"] for x in told["alerts"]] == ["P1"]
    assert told["groupKey"].endswith("severity=P1,tier=P1}")
    rig.step(60, [graver])
    assert len(sink.bodies()) == 1
