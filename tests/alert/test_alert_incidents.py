"""Incident grouping through the entity graph and time; the root is the lowest layer, earliest."""

from __future__ import annotations

from gpuscope.alert.engine import AlertEngine
from gpuscope.alert.incidents import IncidentTracker, describe, layer, link_keys
from gpuscope.alert.ranking import incident_summary
from gpuscope.model import Alert, Finding

RANK = {"job": "llm", "rank": "6", "node": "node-1", "gpu": "2"}


def finding(rule: str, entity: dict[str, str], **details: object) -> Finding:
    return Finding(rule, entity, f"{rule} on {entity}", details=dict(details))


def test_stalled_job_then_lost_rank_then_lost_gpu_merge_into_one_incident_rooted_at_the_gpu() -> None:
    """Order of firing does not matter: the root is the lowest layer, whatever fired first."""
    engine = AlertEngine(resolve_after=0.0)
    engine.update(100.0, [finding("training_stalled", {"job": "llm"})])
    engine.update(
        101.0,
        [
            finding("training_stalled", {"job": "llm"}),
            finding("gpu_thermal_throttle", {"node": "node-1", "gpu": "2"}),
        ],
    )
    engine.update(
        102.0,
        [
            finding("training_stalled", {"job": "llm"}),
            finding("rank_lost", RANK),
            finding("gpu_thermal_throttle", {"node": "node-1", "gpu": "2"}),
        ],
    )
    alerts = {a.rule: a for a in engine.all()}
    assert len({a.incident for a in alerts.values()}) == 1  # rank_lost bridged the job and the GPU
    (incident,) = engine.incidents()
    assert incident.id == "inc-1" and incident.root == alerts["gpu_thermal_throttle"].id
    assert incident.started_at == 100.0 and incident.resolved_at is None
    assert incident.title == "gpu_thermal_throttle on node-1 GPU 2 (+2 related)"
    engine.update(110.0, [])
    (incident,) = engine.incidents()
    assert incident.resolved_at == 110.0
    assert incident.to_dict()["members"] == [a.id for a in engine.all()]


def test_job_alerts_link_to_their_nodes_through_details_links() -> None:
    engine = AlertEngine()
    engine.update(0.0, [finding("gpu_xid_fatal", {"node": "node-4", "gpu": "0"})])
    engine.update(9.0, [finding("training_stalled", {"job": "llm"}, links=[{"node": "node-4"}])])
    assert len(engine.incidents()) == 1


def test_unrelated_or_distant_alerts_are_separate_incidents() -> None:
    tracker = IncidentTracker(window=600.0)
    first = alert("al-1", "gpu_lost", {"node": "node-1", "gpu": "0"}, 0.0)
    other_node = alert("al-2", "node_unreachable", {"node": "node-2"}, 5.0)
    same_node_soon = alert("al-3", "node_unreachable", {"node": "node-1"}, 30.0)
    same_node_later = alert("al-4", "gpu_thermal_throttle", {"node": "node-1", "gpu": "5"}, 700.0)
    for a in (first, other_node, same_node_soon, same_node_later):
        tracker.add(a)
    assert [a.incident for a in (first, other_node, same_node_soon, same_node_later)] == [
        "inc-1",
        "inc-2",
        "inc-1",
        "inc-3",
    ]
    incidents = tracker.incidents()
    assert [i.members for i in incidents] == [["al-1", "al-3"], ["al-2"], ["al-4"]]
    assert incidents[0].root == "al-1" and tracker.get("inc-9") is None


def test_layers_links_and_names() -> None:
    assert [
        layer(e)
        for e in (
            {"node": "a", "gpu": "1"},
            {"node": "a"},
            RANK,
            {"job": "j"},
            {"service": "s", "node": "a"},
            {},
            {"job": "j", "node": "a", "gpu": "1"},  # a GPU's alert naming the job it serves
        )
    ] == [0, 1, 2, 3, 4, 5, 0]
    assert link_keys(RANK) == {"job:llm", "node:node-1", "gpu:node-1/2"}
    assert link_keys({"job": "j"}, [{"node": "n"}, "junk"]) == {"job:j", "node:n"}
    assert [
        describe(e)
        for e in (
            {"node": "a", "gpu": "1"},
            {"node": "a"},
            RANK,
            {"job": "j"},
            {"service": "s"},
            {"cluster": "c"},
            {"job": "j", "node": "a", "gpu": "1"},
        )
    ] == ["a GPU 1", "node a", "job llm rank 6", "job j", "service s", "cluster=c", "a GPU 1"]


def alert(alert_id: str, rule: str, entity: dict[str, str], started_at: float) -> Alert:
    return Alert(alert_id, rule, "P1", "platform", entity, started_at, rule, 0.0)


def test_an_ended_incident_is_reopened_only_by_an_alert_soon_after_it_ended() -> None:
    tracker = IncidentTracker(window=600.0, reopen_within=120.0)
    first = alert("al-1", "node_unreachable", {"node": "node-6"}, 0.0)
    tracker.add(first)
    first.resolved_at = 100.0
    flapped = alert("al-2", "node_unreachable", {"node": "node-6"}, 150.0)  # 50 s after: the same trouble
    tracker.add(flapped)
    flapped.resolved_at = 200.0
    later = alert("al-3", "gpu_xid_fatal", {"node": "node-6", "gpu": "7"}, 400.0)  # long after: a new fault
    tracker.add(later)
    assert [first.incident, flapped.incident, later.incident] == ["inc-1", "inc-1", "inc-2"]
    assert tracker.incidents()[0].resolved_at == 200.0


def test_a_fault_elsewhere_never_joins_an_incident_whose_root_cause_resolved() -> None:
    """Seen in the demo: an ECC error on node-0 filed under "gpu_lost on node-2 GPU 3", through the
    stalled job (still firing) that runs on both nodes."""
    tracker = IncidentTracker(window=600.0, reopen_within=120.0)
    places = [{"node": f"node-{n}"} for n in range(3)]
    lost = alert("al-1", "gpu_lost", {"node": "node-2", "gpu": "3"}, 0.0)
    tracker.add(lost)
    stalled = alert("al-2", "training_stalled", {"job": "llm"}, 5.0)
    tracker.add(stalled, places)
    early = alert("al-3", "gpu_ecc_uncorrectable", {"node": "node-0", "gpu": "1"}, 50.0)
    tracker.add(early)  # while the root fires, a fault on the job's nodes may be its knock-on
    lost.resolved_at = 100.0  # the GPU is back; the job is still stalled
    ecc = alert("al-4", "gpu_ecc_uncorrectable", {"node": "node-0", "gpu": "5"}, 200.0)
    tracker.add(ecc)
    again = alert("al-5", "gpu_xid_fatal", {"node": "node-2", "gpu": "3"}, 150.0)
    tracker.add(again)  # the root's own GPU, soon after: the same story
    failed = alert("al-6", "job_failed", {"job": "llm"}, 210.0)
    tracker.add(failed, places)  # links both; joins the one whose root still fires, merges nothing
    incidents = [a.incident for a in (lost, stalled, early, ecc, again, failed)]
    assert incidents == ["inc-1", "inc-1", "inc-1", "inc-2", "inc-1", "inc-2"]
    assert tracker.get("inc-1") is not None and tracker.get("inc-1").root == "al-1"  # type: ignore[union-attr]


def p3(alert_id: str, rule: str, entity: dict[str, str], started_at: float) -> Alert:
    return Alert(alert_id, rule, "P3", "platform", entity, started_at, rule, 0.0)


def test_a_gpu_slow_from_its_start_is_the_root_of_its_ranks_placement() -> None:
    """Seen: the ranks' slow_placement (job only) fired first and rooted the incident, and the GPU's
    (labels job, node, gpu) read as a job alert: "slow_placement on job llm", the GPU a member."""
    tracker = IncidentTracker(window=600.0)
    places = [{"node": "node-1", "gpu": str(g)} for g in range(4)]
    ranks = p3("al-1", "slow_placement", {"job": "llm"}, 40.0)
    tracker.add(ranks, places)
    gpu = p3("al-2", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "2"}, 330.0)
    tracker.add(gpu)
    (incident,) = tracker.incidents()
    assert incident.root == "al-2" and incident.members == ["al-1", "al-2"]
    assert incident.title == "slow_placement on node-1 GPU 2 (+1 related)"


def test_a_placement_is_no_root_beside_a_live_fault() -> None:
    """A job that stalls beside its slow GPU: the stall is what to act on, the placement a member."""
    tracker = IncidentTracker(window=600.0)
    gpu = p3("al-1", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "2"}, 330.0)
    tracker.add(gpu)
    stalled = alert("al-2", "training_stalled", {"job": "llm"}, 400.0)
    tracker.add(stalled, [{"node": "node-1"}])
    (incident,) = tracker.incidents()
    assert incident.root == "al-2" and incident.title == "training_stalled on job llm (+1 related)"
    hot = alert("al-3", "gpu_thermal_throttle", {"node": "node-1", "gpu": "2"}, 410.0)
    tracker.add(hot)  # a live fault on the GPU is lower than the stall: it roots the incident
    assert tracker.incidents()[0].root == "al-3"


def test_a_slow_gpu_and_its_ranks_placement_through_the_engine_are_one_incident_costed_once() -> None:
    """As a hub files them: the ranks' placement (job only) linked to the GPUs the job runs on."""
    engine = AlertEngine(places=lambda entity: [{"node": "node-1", "gpu": str(g)} for g in range(4)])
    ranks = Finding("slow_placement", {"job": "llm"}, "ranks 5 slower", affected_gpus=8, at_risk=0.09)
    gpu = Finding(
        "slow_placement",
        {"job": "llm", "node": "node-1", "gpu": "1"},
        "GPU slower",
        affected_gpus=8,
        at_risk=0.1,
    )
    engine.update(40.0, [ranks])
    engine.update(330.0, [ranks, gpu])
    (incident,) = engine.incidents()
    alerts = {a.id: a for a in engine.all()}
    root = alerts[incident.root]
    assert root.entity == {"job": "llm", "node": "node-1", "gpu": "1"} and len(incident.members) == 2
    summary = incident_summary(incident, alerts)
    assert summary["tier"] == "P3" and summary["root_rule"] == "slow_placement"
    # one pace of one job: its larger cost, not the sum of two measurements of it
    assert summary["cost_per_hour"] == max(a.cost_per_hour for a in alerts.values()) > 0


def ranks_placement(alert_id: str, started_at: float, *gpus: tuple[str, str]) -> Alert:
    """The ranks' slow_placement as the rank detector files it: the GPUs its slow ranks run on."""
    placed = p3(alert_id, "slow_placement", {"job": "llm"}, started_at)
    placed.details = {"slow_ranks": [5], "links": [{"node": n, "gpu": g} for n, g in gpus]}
    return placed


def test_a_slow_gpu_and_its_ranks_placement_are_one_incident_however_far_apart_they_fire() -> None:
    """Seen: past the 600-s window the GPU's placement (its pace is learned from 300 readings, 50
    minutes of a 10-s agent) and the ranks' one were two incidents for one slow part."""
    job = [{"node": "node-1", "gpu": str(g)} for g in range(4)]
    tracker = IncidentTracker(window=600.0)
    tracker.add(ranks_placement("al-1", 40.0, ("node-1", "1")), job)
    tracker.add(p3("al-2", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "1"}, 3040.0))
    (incident,) = tracker.incidents()
    assert incident.root == "al-2" and incident.title == "slow_placement on node-1 GPU 1 (+1 related)"

    # the other way round: the GPU first, the ranks grouped 30 minutes later (they joined late)
    tracker = IncidentTracker(window=600.0)
    tracker.add(p3("al-1", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "1"}, 330.0))
    tracker.add(ranks_placement("al-2", 2130.0, ("node-1", "1")), job)
    (incident,) = tracker.incidents()
    assert incident.root == "al-1" and incident.members == ["al-1", "al-2"]

    # a GPU faulty from its start is a P2 live fault: it roots the incident and sets its tier
    tracker = IncidentTracker(window=600.0)
    ranks = ranks_placement("al-1", 34.0, ("node-1", "1"))
    tracker.add(ranks, job)
    broken = alert("al-2", "gpu_underperforming", {"node": "node-1", "gpu": "1"}, 3034.0)
    broken.severity, broken.details = "P2", {"job": "llm", "since_start": True}
    ranks.cost_per_hour, broken.cost_per_hour = 2.6, 2.9  # two measurements of the job's one pace
    tracker.add(broken)
    (incident,) = tracker.incidents()
    summary = incident_summary(incident, {"al-1": ranks, "al-2": broken})
    assert incident.root == "al-2" and summary["tier"] == "P2" and incident.members == ["al-1", "al-2"]
    assert summary["cost_per_hour"] == 2.9  # the job's pace lost once, not 5.5


def test_past_the_window_only_what_names_the_slow_gpu_of_that_job_joins_its_placement() -> None:
    """A live fault elsewhere, a new fault on that GPU, another GPU's or another job's placement, or
    a placement after the first one ended: each roots its own incident, as before."""
    tracker = IncidentTracker(window=600.0)
    tracker.add(ranks_placement("al-1", 40.0, ("node-1", "1")), [{"node": "node-1", "gpu": "1"}])
    later = [
        alert("al-2", "gpu_xid_fatal", {"node": "node-0", "gpu": "0"}, 3000.0),  # elsewhere in the job
        alert("al-3", "gpu_underperforming", {"node": "node-1", "gpu": "1"}, 4000.0),  # slowed down now
        p3("al-4", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "3"}, 5000.0),
        p3("al-5", "slow_placement", {"job": "other", "node": "node-1", "gpu": "1"}, 6000.0),
    ]  # each past the window of the others
    later[1].details = {"job": "llm"}
    for one in later:
        tracker.add(one)
    roots = {i.root: i.members for i in tracker.incidents()}
    assert roots == {"al-1": ["al-1"], "al-2": ["al-2"], "al-3": ["al-3"], "al-4": ["al-4"], "al-5": ["al-5"]}

    tracker = IncidentTracker(window=600.0)
    ranks = ranks_placement("al-1", 40.0, ("node-1", "1"))
    tracker.add(ranks)
    ranks.resolved_at = 1000.0  # the job ended; the GPU's placement of a new job there is new
    tracker.add(p3("al-2", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "1"}, 4000.0))
    assert [i.members for i in tracker.incidents()] == [["al-1"], ["al-2"]]


def test_through_the_engine_a_slow_gpu_50_minutes_after_its_ranks_placement_is_its_root() -> None:
    """As a hub files them: the ranks' placement names the GPU its slow rank runs on (its links, so
    not every GPU of the job), and the GPU's own alert comes when its pace is learned."""
    engine = AlertEngine(places=lambda entity: [{"node": "node-1", "gpu": str(g)} for g in range(4)])
    ranks = Finding(
        "slow_placement",
        {"job": "llm"},
        "ranks 5 slower",
        affected_gpus=8,
        at_risk=0.13,
        details={"slow_ranks": [5], "links": [{"node": "node-1", "gpu": "1"}]},
    )
    elsewhere = Finding("gpu_xid_fatal", {"node": "node-0", "gpu": "3"}, "XID 79")
    broken = Finding(
        "gpu_underperforming",
        {"node": "node-1", "gpu": "1"},
        "faulty from its start",
        affected_gpus=8,
        at_risk=0.129,
        details={"job": "llm", "since_start": True},
    )
    engine.update(40.0, [ranks])
    engine.update(3000.0, [ranks, elsewhere])
    engine.update(3040.0, [ranks, broken])
    alerts = {a.rule: a for a in engine.all()}
    by_root = {i.root: i for i in engine.incidents()}
    (mine,) = [i for i in by_root.values() if alerts["slow_placement"].id in i.members]
    assert mine.root == alerts["gpu_underperforming"].id and len(mine.members) == 2
    summary = incident_summary(mine, {a.id: a for a in engine.all()})
    assert summary["tier"] == "P2" and summary["cost_per_hour"] == alerts["slow_placement"].cost_per_hour
    # an XID on another node, 50 minutes after the placement and beside the slow GPU: its own incident
    assert alerts["gpu_xid_fatal"].id in by_root


def test_a_placement_whose_links_grew_after_it_fired_still_merges_joins_and_is_forgotten() -> None:
    """A firing alert's details are refreshed at every evaluation, so the GPUs the ranks' placement
    names can grow after it was filed; the join by name must follow its incident through a merge."""
    tracker = IncidentTracker(window=600.0)
    xid = alert("al-1", "gpu_xid_fatal", {"node": "node-2", "gpu": "0"}, 30.0)
    tracker.add(xid)
    ranks = ranks_placement("al-2", 40.0, ("node-1", "1"))
    tracker.add(ranks)
    ranks.details["links"].append({"node": "node-1", "gpu": "2"})  # a second slow rank, grouped later
    straggler = alert(
        "al-3", "training_straggler", {"job": "llm", "rank": "9", "node": "node-2", "gpu": "0"}, 60.0
    )
    tracker.add(straggler)  # touches both: the placement's incident merges into the XID's
    assert [i.members for i in tracker.incidents()] == [["al-1", "al-2", "al-3"]]
    gpu = p3("al-4", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "1"}, 4000.0)
    tracker.add(gpu)
    assert [i.members for i in tracker.incidents()] == [["al-1", "al-2", "al-3", "al-4"]]
    for one in (xid, ranks, straggler, gpu):
        one.resolved_at = 4100.0
    assert len(tracker.forget(5000.0, alerts=10)) == 4 and tracker.incidents() == []
    tracker.add(p3("al-5", "slow_placement", {"job": "llm", "node": "node-1", "gpu": "2"}, 6000.0))
    assert [i.members for i in tracker.incidents()] == [["al-5"]]
