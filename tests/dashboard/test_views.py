"""The dashboard's JSON views over a real replayed run, read over HTTP as the pages read them."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from dashboard.conftest import Served
from gpuscope.hub import Hub
from gpuscope.model import Batch, Event, Finding, Frame, TrainingRecord
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.dashboard.fleet import node_view
from gpuscope.web.dashboard.jobs import _stragglers, goodput, job_view, jobs_view


@pytest.fixture
def client(served: Served) -> httpx.Client:
    return httpx.Client(base_url=served.url, timeout=10)


def test_fleet_marks_faulty_gpus_and_counts_idle(client: httpx.Client) -> None:
    body = client.get("/api/v1/ui/fleet", params={"metric": "gpu_temp_celsius"}).json()
    cells = {
        (n["node"], g[0]): dict(zip(("gpu", "v", "s", "job", "idle", "pstate", "cause"), g, strict=True))
        for n in body["nodes"]
        for g in n["gpus"]
    }
    assert len(cells) == 32 and body["summary"]["gpus"] == 32
    assert cells[("node-1", "5")]["s"] == "P2"  # thermal throttle, firing
    assert cells[("node-2", "6")]["s"] == "P1"  # fell off the bus
    assert cells[("node-0", "0")]["s"] == "ok"
    assert cells[("node-1", "5")]["v"] > cells[("node-1", "4")]["v"] + 10  # hotter than its peer
    badges = {n["node"]: n["badge"] for n in body["nodes"]}
    assert badges["node-2"] == "P1" and badges["node-3"] == "ok"
    idle = body["idle"]
    # eval-sweep's 4 GPUs sit idle while allocated; 4 of node-2 and 4 of node-3 are unallocated
    assert {(g["node"], g["gpu"]) for g in idle["gpus"] if g["job"] == "eval-sweep"} == {
        ("node-2", str(i)) for i in range(4)
    }
    assert idle["allocated"] == 4
    assert idle["cost_per_hour"] == pytest.approx((idle["allocated"] + idle["unallocated"]) * 2.5)
    # the productivity model's state of each GPU, as every page shows it
    assert (cells[("node-2", "6")]["pstate"], cells[("node-2", "6")]["cause"]) == ("down", "lost_gpu")
    assert {cells[("node-2", str(i))]["pstate"] for i in range(4)} == {"idle_allocated"}
    assert {cells[("node-3", str(i))]["pstate"] for i in range(4)} == {"productive"}
    assert cells[("node-3", "7")]["pstate"] == "idle_unallocated"
    assert body["states_now"]["down"] == 1
    assert body["productivity"] is not None and body["productivity"]["states"]["down"]["gpu_hours"] > 0


def test_fleet_refuses_unknown_metric(client: httpx.Client) -> None:
    res = client.get("/api/v1/ui/fleet", params={"metric": "no_such_metric"})
    assert res.status_code == 400 and res.json()["field"] == "metric"


def test_a_node_lists_the_alerts_of_the_job_and_service_running_on_it(
    served: Served, client: httpx.Client
) -> None:
    """Seen: "no firing alerts" on a node whose GPUs' job sat idle (P2) and whose service failed."""
    work = [
        a
        for a in served.hub.firing()
        if "node" not in a.entity
        and (a.entity.get("job") == "eval-sweep" or a.entity.get("service") == "chat-api")
    ]
    assert work  # the idle allocation (and the service's latency) are firing at the end of the replay
    listed = {
        node: {a["id"] for a in client.get("/api/v1/ui/node", params={"node": node}).json()["alerts"]}
        for node in ("node-0", "node-2", "node-3")
    }
    for alert in work:
        home = "node-2" if alert.entity.get("job") == "eval-sweep" else "node-3"
        assert alert.id in listed[home], alert.rule
        assert alert.id not in listed["node-0"]  # nothing of theirs runs there


def test_node_view_and_unknown_node(client: httpx.Client) -> None:
    body = client.get("/api/v1/ui/node", params={"node": "node-1"}).json()
    assert [g["gpu"] for g in body["gpus"]] == [str(i) for i in range(8)]
    assert body["host"]["values"]["node_cpu_percent"] >= 0
    assert any(a["rule"] == "gpu_thermal_throttle" for a in body["alerts"])
    res = client.get("/api/v1/ui/node", params={"node": "node-99"})
    assert (res.status_code, res.json()["field"]) == (404, "node")  # the parameter named, not "name"
    res = client.get("/api/v1/ui/service", params={"service": "nope"})
    assert (res.status_code, res.json()) == (404, {"error": "nothing known about 'nope'", "field": "service"})


def test_job_view_curves_straggler_checkpoints_goodput(client: httpx.Client, served: Served) -> None:
    body = client.get(
        "/api/v1/ui/job", params={"job": "llm-pretrain", "start": served.t0, "points": 60}
    ).json()
    assert body["ranks"] == list(range(16))
    assert len(body["ts"]) > 10
    assert all(len(v) == len(body["ts"]) for v in body["curves"]["loss"].values())
    assert 3 in {s["rank"] for s in body["stragglers"]}  # the injected straggler
    assert [c["step"] for c in body["checkpoints"] if c["completed"]], "checkpoints every 60 s"
    good = body["goodput"]
    assert 0 < good["productive"] < good["elapsed"]
    parts = good["productive"] + good["data_wait"] + good["checkpoint"] + good["restart"] + good["stalled"]
    assert parts == pytest.approx(good["elapsed"])
    assert body["placement"]["3"] == {"node": "node-0", "gpu": "3"}


def test_jobs_services_reports(client: httpx.Client) -> None:
    jobs = {j["job"]: j for j in client.get("/api/v1/ui/jobs").json()["jobs"]}
    assert jobs["llm-pretrain"]["state"] == "running" and jobs["llm-pretrain"]["gpus_now"] == 16
    services = client.get("/api/v1/ui/services").json()["services"]
    assert [s["service"] for s in services] == ["chat-api"] and services[0]["versions"] == ["v7"]
    rep = client.get("/api/v1/ui/reports", params={"days": 30}).json()
    assert rep["idle_allocated"]["by_job"].get("eval-sweep", 0) > 0
    assert rep["failing_candidates"][0]["node"] == "node-2" and rep["failing_candidates"][0]["gpu"] == "6"
    assert 0 < rep["unused_capacity"]["observed_hours"] <= 1.0
    assert rep["trend"] and rep["trend"][0][1] is not None


def test_reports_cover_the_range_asked_for(client: httpx.Client) -> None:
    month = client.get("/api/v1/ui/reports", params={"range": 30 * 86400}).json()
    hour = client.get("/api/v1/ui/reports", params={"range": 3600}).json()
    assert (month["range_seconds"], month["trend_bucket_seconds"]) == (30 * 86400, 86400)
    assert (hour["range_seconds"], hour["trend_bucket_seconds"]) == (3600, 300)
    assert hour["end"] - hour["start"] == pytest.approx(3600)
    assert all(hour["start"] <= ts <= hour["end"] for ts, _ in hour["trend"])
    # the replayed five minutes lie in both, so both count the same idle GPU-hours
    assert hour["idle_allocated"]["gpu_hours"] == month["idle_allocated"]["gpu_hours"] > 0
    old = client.get("/api/v1/ui/reports", params={"days": 7}).json()
    assert old["range_seconds"] == 7 * 86400
    bad = client.get("/api/v1/ui/reports", params={"range": "10"})
    assert bad.status_code == 400 and bad.json()["field"] == "range"


def test_bad_parameters_are_named(client: httpx.Client) -> None:
    res = client.get("/api/v1/ui/job", params={"job": "llm-pretrain", "start": "x"})
    assert res.status_code == 400 and res.json()["field"] == "start"
    assert client.get("/api/v1/ui/job").json()["field"] == "job"
    assert client.get("/api/v1/ui/reports", params={"days": "0"}).status_code == 400


def test_pages_and_assets_are_served_locally(client: httpx.Client) -> None:
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/"
    html = client.get("/ui/").text
    assert "/ui/static/vendor/uPlot.iife.min.js" in html and "http" not in html.split("<body>")[1]
    js = client.get("/ui/static/vendor/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
    caps = client.get("/api/v1/ui/capabilities").json()
    assert caps["alerting"] is True and caps["lineage"] is True


def test_a_lost_gpus_last_values_are_stale_at_once() -> None:
    """Seen: a GPU 40 s off the bus showed util 100 % and 580 W as current (stale only after 15 s of
    the node reporting without it, and not at all on the GPU page)."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    try:
        for t in range(1, 31):
            gpus = 2 if t <= 25 else 1  # GPU 1 falls off the bus at 25 s
            entities = [{"node": "node-0", "gpu": str(g)} for g in range(gpus)]
            values = np.array([[100.0, 580.0]] * gpus)
            frame = Frame(float(t), ["gpu_utilization_percent", "gpu_power_watts"], entities, values)
            hub.ingest(Batch("node-0", frames=[frame]))
            hub.evaluate(float(t))
        gpus = {g["gpu"]: g for g in node_view(hub, "node-0", 15.0)["gpus"]}
        assert gpus["1"]["stale"] and gpus["1"]["pstate"] == "down" and gpus["1"]["cause"] == "lost_gpu"
        assert not gpus["0"]["stale"] and gpus["0"]["pstate"] == "productive"
    finally:
        hub.store.close()


def test_fallback_straggler_reads_the_arrival_gap_the_sdk_sends() -> None:
    """Seen: with no straggler alert, the job page read only collective_arrival_skew_seconds, which
    the SDK no longer sends (it sends each rank's collective_arrival_gap_seconds)."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    try:
        gaps = {0: 0.30, 1: 0.31, 2: 0.42, 3: 0.30}  # rank 2 arrives 0.11 s after its peers
        gap, skew = "collective_arrival_gap_seconds", "collective_arrival_skew_seconds"
        steps = [(s, r, g + 0.001 * (s % 3)) for s in range(20) for r, g in gaps.items()]
        rows = [TrainingRecord(float(s), "j", r, s, {gap: v}) for s, r, v in steps]
        named = {"rank": 2, "source": "collective arrival skew", "firing": None}
        assert _stragglers(hub, "j", rows) == [named]
        # a firing slow_placement names rank 2 (its GPU is slower from its start): no straggler
        assert _stragglers(hub, "j", rows, frozenset({2})) == []
        even = [TrainingRecord(r.ts, "j", r.rank, r.step, {gap: 0.3}) for r in rows]
        assert _stragglers(hub, "j", even) == []
        old = [TrainingRecord(r.ts, "j", r.rank, r.step, {skew: 0.0}) for r in rows]
        old += [TrainingRecord(1.0, "j", 3, 1, {skew: 0.2})] * 40
        assert _stragglers(hub, "j", old)[0]["rank"] == 3  # an older SDK's skew still counts
    finally:
        hub.store.close()


def test_a_cpu_ranks_placement_names_no_gpu() -> None:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    try:
        started = Event(1.0, "job_started", {"job": "c"}, {"world_size": 2, "placement": [[0, "node-1", ""]]})
        rows = [
            TrainingRecord(2.0 + s, "c", r, s, {"loss": 1.0}, {"node": "node-1"})
            for s in range(3)
            for r in (0, 1)
        ]
        hub.ingest(Batch("sdk", events=[started], training=rows))
        view = job_view(hub, "c", 0.0, 10.0, 10)
        assert view["placement"] == {"0": {"node": "node-1"}, "1": {"node": "node-1"}}
    finally:
        hub.store.close()


def test_reports_show_queue_wait_and_demand_vs_capacity_per_partition(slurm_served: Served) -> None:
    """The Slurm collector's series kept by the hub, read back through the Reports page's API."""
    rep = httpx.get(f"{slurm_served.url}/api/v1/ui/reports", params={"days": 1}, timeout=10).json()
    (debug,) = rep["scheduler"]
    assert debug["partition"] == "debug"
    assert debug["queue_wait_seconds"] == {"mean": 1.0, "max": 1.0}
    # demand: 2 GPUs pending + 1 running; capacity: 2 GPUs, both on the drained node
    assert debug["demand_gpus"] == {"mean": 3.0, "max": 3.0}
    assert debug["capacity_gpus"] == {"mean": 0.0, "min": 0.0}
    h = debug["history"]
    assert len(h["ts"]) == 4 and h["ts"] == sorted(h["ts"])
    assert h["demand_gpus"] == [3.0] * 4 and h["capacity_gpus"] == [0.0] * 4
    assert h["gpus_total"] == [2.0] * 4 and h["queue_wait_seconds"] == [1.0] * 4
    waited = h["oldest_pending_seconds"]
    assert waited == sorted(waited) and waited[-1] > 0  # the pending job waits longer each round


def test_a_finished_jobs_page_answers_after_its_state_is_forgotten() -> None:
    """The productivity model forgets a finished job's view after the retention: its page and
    GPU time still answer (from the stored events and the GPU-time rollups), as before."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    hub.productivity.finished_job_retention_s = 300.0
    try:
        start = {"kind": "training", "world_size": 2, "placement": [[0, "node-0", "0"], [1, "node-0", "1"]]}
        hub.ingest(Batch("sdk", events=[Event(0.0, "job_started", {"job": "j"}, start)]))
        for t in range(1, 700):
            job = {"job": "j"} if t <= 60 else {}
            entities = [{"node": "node-0", "gpu": str(g), **job} for g in range(2)]
            frame = Frame(float(t), ["gpu_utilization_percent"], entities, np.array([[95.0], [95.0]]))
            records = (
                [TrainingRecord(float(t), "j", r, t, {"loss": 1.0 / t}) for r in range(2)] if t <= 60 else []
            )
            events = [Event(60.5, "job_ended", {"job": "j"})] if t == 61 else []
            hub.ingest(Batch("node-0", frames=[frame], events=events, training=records))
            hub.evaluate(float(t))
            if t == 100:
                before = job_view(hub, "j", 0.0, 100.0, 50)
        after = job_view(hub, "j", 0.0, 100.0, 50)
        assert "j" not in hub.productivity.jobs
        assert hub.counters.get("productivity_jobs_forgotten") == 1
        assert before["status"] == after["status"] == "finished"
        assert after["productivity"] is not None and after["productivity"] == before["productivity"]
        assert after["last_step"] == 60
        assert [j["status"] for j in jobs_view(hub, 700.0)["jobs"] if j["job"] == "j"] == ["finished"]
    finally:
        hub.store.close()


def test_goodput_counts_no_stall_from_the_rounding_of_its_sums() -> None:
    """Seen: "stalled 0.0 % (9.3e-8 s)" on a job that never stalled."""
    records = [
        TrainingRecord(0.1 * k, "tenths", 0, k, {"step_seconds": 0.1}, {"node": "n"}) for k in range(1, 11)
    ]
    g = goodput(records, [], 0.0, 10.0)
    assert g["elapsed"] == pytest.approx(1.0) and g["productive"] == pytest.approx(1.0)
    assert g["stalled"] == 0.0
    records.append(TrainingRecord(3.0, "tenths", 0, 11, {"step_seconds": 0.1}, {"node": "n"}))
    assert goodput(records, [], 0.0, 10.0)["stalled"] == pytest.approx(1.9)  # a real pause still counts


def _placed_job(findings: list[Finding]) -> dict[str, Any]:
    """The job page's data for job ``p`` on node-0's GPUs 0-3 (rank r on GPU r) with ``findings``."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    try:
        place = [[r, "node-0", str(r)] for r in range(4)]
        data = {"kind": "training", "world_size": 4, "placement": place}
        started = Event(0.0, "job_started", {"job": "p"}, data)
        rows = [TrainingRecord(1.0 + s, "p", r, s, {"loss": 1.0}) for s in range(5) for r in range(4)]
        hub.ingest(Batch("sdk", events=[started], training=rows))
        for t in (10.0, 400.0, 800.0):  # past any pending hold of the rule
            hub.alerts.update(t, findings)
        assert {a.rule for a in hub.firing()} == {"slow_placement"}
        return job_view(hub, "p", 0.0, 800.0, 10)
    finally:
        hub.store.close()


GPU_SLOW = Finding(
    "slow_placement",
    {"job": "p", "node": "node-0", "gpu": "2"},
    "node-0 GPU 2 has run 6.0% slower than the other GPUs of its speed group in job p since it started",
    value=0.06,
    affected_gpus=4,
    at_risk=0.06,
    details={"lag_share": 0.06, "lost_share": 0.06, "job": "p", "speed_group": 0},
)
RANKS_SLOW = Finding(
    "slow_placement",
    {"job": "p"},
    "Job p has run at two speeds since it started: ranks 0-1 on node-0 are 30% of a step slower",
    value=0.23,
    affected_gpus=4,
    at_risk=0.23,
    details={"slow_ranks": [0, 1], "slow_nodes": ["node-0"], "group_lag_share": 0.3, "lost_share": 0.23},
)


def test_a_slow_gpus_placement_names_its_gpu_and_the_rank_on_it() -> None:
    """Seen: the job page read a GPU's slow_placement as a placement of no slow ranks."""
    view = _placed_job([GPU_SLOW])
    (gpu,) = view["slow_placements"]
    assert (gpu["kind"], gpu["node"], gpu["gpu"], gpu["ranks"]) == ("gpu", "node-0", "2", [2])
    assert gpu["lag_share"] == pytest.approx(0.06) and gpu["severity"] == "P3"
    assert gpu["cost_per_hour"] > 0 and gpu["summary"] == GPU_SLOW.summary
    assert view["slow_group"] is None  # no group of ranks is slower: no ranks' placement to show


def test_both_kinds_of_slow_placement_are_listed_and_neither_hides_the_other() -> None:
    view = _placed_job([GPU_SLOW, RANKS_SLOW])
    ranks, gpu = view["slow_placements"]
    assert (ranks["kind"], ranks["ranks"], ranks["lost_share"]) == ("ranks", [0, 1], pytest.approx(0.23))
    assert (gpu["kind"], gpu["node"], gpu["gpu"], gpu["ranks"]) == ("gpu", "node-0", "2", [2])
    assert view["slow_group"] is not None and view["slow_group"]["ranks"] == [0, 1]
    assert view["slow_group"]["id"] == ranks["id"] != gpu["id"]
