"""Two sharded hubs on a real PostgreSQL, wired as ``gpuscope hub`` wires them (config file, alerting,
HTTP API): what one hub is told (a silence, an acknowledgement, a lineage record) the other acts on
and answers, and alerts, incidents, playbook results and history read the same from either."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():  # starlette prefers httpx2 for its test client; httpx works as well
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from alert.sink import Sink
from cluster.rig import cluster_of, nodes_of, two_members
from gpuscope.alert.service import AlertingService
from gpuscope.cluster.member import ClusterMember
from gpuscope.cluster.ring import shard_of
from gpuscope.hub import Hub
from gpuscope.ingest.payload import parse_batch
from gpuscope.model import Alert
from gpuscope.runtime import Runtime
from gpuscope.web.api import HubApi
from gpuscope.web.dashboard.reports import reports_view
from support import wait_until

SHARDS = 16
TOKEN = "a-test-token-of-some-length"
AUTH = {"authorization": f"Bearer {TOKEN}"}
RULE = "gpu_ecc_uncorrectable"


@dataclass
class Member:
    hub: Hub
    member: ClusterMember
    alerting: AlertingService
    api: TestClient

    def get(self, path: str, **params: str) -> Any:
        reply = self.api.get(path, params=params)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        reply = self.api.post(path, json=body, headers=AUTH)
        assert reply.status_code in (200, 201), reply.text
        return reply.json()


def _sections(sink: Sink) -> dict[str, Any]:
    return {
        "receivers": [
            {"name": "hook", "webhook": {"url": f"{sink.url}/hook"}},
            {"name": "pager", "webhook": {"url": f"{sink.url}/pager"}},
        ],
        "routes": [{"receiver": "hook", "group_wait": "0s", "repeat_interval": "100s"}],
        "alerting": {"escalation": [{"after": "60s", "receiver": "pager"}]},
    }


def _with_api(runtime: Runtime) -> Member:
    runtime.alerting.outbox.start()  # only delivery runs: the test drives evaluation and the clock
    member = cluster_of(runtime)
    api = HubApi(
        runtime.hub, tokens=[TOKEN], alerting=runtime.alerting, lineage=runtime.lineage, cluster=member
    )
    return Member(runtime.hub, member, runtime.alerting, TestClient(api.app))


@pytest.fixture
def pair(postgres_dsn: str, tmp_path: Path) -> Iterator[tuple[Member, Member, Sink]]:
    with two_members(tmp_path, postgres_dsn, SHARDS, _sections) as (a, b, sink):
        yield _with_api(a), _with_api(b), sink


def _nodes_of(member: Member, count: int) -> list[str]:
    return nodes_of(member.member, count, SHARDS)


def _report(member: Member, node: str, ts: float, dbe: float) -> None:
    """One agent batch from ``node``, ingested by the hub that owns it (its detectors see it)."""
    frame = {
        "ts": ts,
        "metrics": ["gpu_ecc_dbe_volatile_total", "gpu_temp_celsius"],
        "entities": [{"node": node, "gpu": "0"}],
        "values": [[dbe, 60.0]],
    }
    member.hub.ingest(parse_batch({"source": f"agent-{node}", "frames": [frame]}))


def _notified_nodes(sink: Sink, path: str = "/hook") -> list[str]:
    return [a["labels"]["node"] for body in sink.bodies(path) for a in body["alerts"]]


def _told(sink: Sink, path: str) -> list[tuple[str, str]]:
    return sorted((a["labels"]["node"], a["status"]) for body in sink.bodies(path) for a in body["alerts"])


def test_silence_ack_history_incidents_and_playbooks_are_the_same_on_every_hub(
    pair: tuple[Member, Member, Sink],
) -> None:
    a, b, sink = pair
    muted, loud = _nodes_of(b, 2)  # both detected by hub b

    silence = a.post("/api/v1/silences", {"matchers": {"node": muted}, "duration": "1h", "created_by": "ops"})
    assert [s["id"] for s in b.get("/api/v1/silences")["silences"]] == [silence["id"]]

    t0 = time.time()
    for node in (muted, loud):
        _report(b, node, t0 - 1, 0.0)
        _report(b, node, t0, 2.0)
    fired = b.hub.evaluate(t0)
    assert b.alerting.drain(10.0)  # triaged and dispatched, as its worker would
    assert sorted(c.alert.entity["node"] for c in fired if c.kind == "fired") == sorted([muted, loud])
    sink.wait_for(1)
    time.sleep(1.0)  # the outbox polls every 0.5 s: a notification for the muted node would be here
    assert _notified_nodes(sink) == [loud]  # hub b honoured the silence hub a created
    # every hub reports the cluster's one outbox, where that notification went
    for member in (a, b):
        assert member.get("/api/v1/alerting/status")["outbox"] == {"delivered": 1, "dead": 0, "pending": 0}

    rows = {r["entity"]["node"]: r for r in a.get("/api/v1/alerting/alerts")["alerts"]}
    assert rows[muted]["muted"] == f"silenced by {silence['id']}" and rows[loud]["muted"] is None
    alert_id = rows[muted]["id"]
    book = rows[muted]["details"]["playbook"]  # run by hub b when it fired, read from hub a
    assert book["diagnosis"] and book["evaluated_at"] == pytest.approx(t0)

    assert a.post(f"/api/v1/alerts/{alert_id}/ack", {"by": "alice", "comment": "swapping it"}) == {
        "acknowledged": [alert_id]
    }
    on_b = {r["id"]: r for r in b.get("/api/v1/alerting/alerts")["alerts"]}
    assert on_b[alert_id]["ack"]["by"] == "alice" and on_b[loud_id(on_b, loud)]["ack"] is None
    assert b.alerting.acked(b.hub.alerts.get(alert_id) or pytest.fail("alert missing on b"))
    what = [h["what"] for h in b.get(f"/api/v1/alerts/{alert_id}/history")["history"]]
    assert what == ["fired", "acknowledged"]

    # the fault clears and the owner resolves it: the acknowledgement another hub attached stays on it
    for node in (muted, loud):
        _report(b, node, t0 + 20, 0.0)
    assert [c.kind for c in b.hub.evaluate(t0 + 20)] == ["resolved", "resolved"]
    assert b.alerting.drain(10.0)
    stored = {r["id"]: r for r in a.get("/api/v1/alerts", state="all")["alerts"]}
    assert stored[alert_id]["resolved_at"] is not None and stored[alert_id]["details"]["ack"]["by"] == "alice"

    assert a.get("/api/v1/alerts", state="all") == b.get("/api/v1/alerts", state="all")
    incidents = a.get("/api/v1/incidents")["incidents"]
    assert len(incidents) == 2 and incidents == b.get("/api/v1/incidents")["incidents"]
    assert a.get("/api/v1/alerting/incidents") == b.get("/api/v1/alerting/incidents")
    assert {r["incident"] for r in stored.values()} == {i["id"] for i in incidents}


def loud_id(rows: dict[str, Any], node: str) -> str:
    return next(i for i, r in rows.items() if r["entity"]["node"] == node)


def test_lineage_written_on_one_hub_is_read_on_the_other(pair: tuple[Member, Member, Sink]) -> None:
    a, b, _ = pair
    a.post("/api/v1/lineage/checkpoints", {"job": "pretrain", "step": 1200, "manifest_hash": "ab" * 16})
    a.post("/api/v1/lineage/versions", {"model": "chat", "version": "v7", "job": "pretrain", "step": 1200})
    b.post(
        "/api/v1/lineage/promotions",
        {"service": "chat-api", "model": "chat", "version": "v7", "alias": "champion"},
    )
    shown = b.get("/api/v1/lineage/versions/chat/@champion")
    assert shown["version"] == "v7" and shown["checkpoint"]["manifest_hash"] == "ab" * 16
    assert a.get("/api/v1/lineage/versions/chat/v7") == shown
    assert [
        d["service"] for d in a.get("/api/v1/lineage/deployments", service="chat-api")["deployments"]
    ] == ["chat-api"]


def test_mutes_lifting_repeats_and_escalation_on_a_member_are_a_single_hubs(
    pair: tuple[Member, Member, Sink],
) -> None:
    a, b, sink = pair
    muted, loud = _nodes_of(b, 2)
    silence = a.post("/api/v1/silences", {"matchers": {"node": muted}, "duration": "1h"})
    t0 = time.time()
    clock = [t0]
    for m in (a, b):
        m.alerting.clock = lambda: clock[0]
        m.alerting.outbox.clock = lambda: time.time() + 200  # rows are due at the test's times
    for node in (muted, loud):
        _report(b, node, t0 - 1, 0.0)
        _report(b, node, t0, 2.0)
    ids = {c.alert.entity["node"]: c.alert.id for c in b.hub.evaluate(t0)}
    assert b.alerting.drain(10.0)

    def tick(member: Member, at: float) -> None:
        clock[0] = at
        member.alerting.tick(at)

    # a P1 nobody acknowledged escalates once; a silenced one does not; the other member, which
    # owns neither, sends nothing
    tick(b, t0 + 61)
    tick(a, t0 + 62)
    a.post(f"/api/v1/alerts/{ids[muted]}/ack", {"by": "alice"})  # acknowledged: it will not escalate
    assert a.api.delete(f"/api/v1/silences/{silence['id']}", headers=AUTH).status_code == 200
    tick(b, t0 + 63)  # the mute lifted (on another member): told now, once
    tick(b, t0 + 101)  # loud is repeated; muted was told at t0 + 63
    clock[0] = t0 + 120
    for node in (muted, loud):
        _report(b, node, t0 + 120, 0.0)
    assert len(b.hub.evaluate(t0 + 120)) == 2
    assert b.alerting.drain(10.0)
    tick(b, t0 + 131)  # loud's resolution waits for its group_interval since the repeat

    hook = [(muted, "firing"), (muted, "resolved"), (loud, "firing"), (loud, "firing"), (loud, "resolved")]
    wait_until(
        lambda: len(_told(sink, "/hook")) == 5 and len(_told(sink, "/pager")) == 2, 10, "notifications"
    )
    time.sleep(1.0)  # anything sent twice would be here by now
    assert _told(sink, "/hook") == sorted(hook)
    assert _told(sink, "/pager") == [(loud, "firing"), (loud, "resolved")]
    assert "escalated" in [h["what"] for h in a.get(f"/api/v1/alerts/{ids[loud]}/history")["history"]]


def test_dashboard_pages_of_every_member_read_the_clusters_alerts(pair: tuple[Member, Member, Sink]) -> None:
    a, b, _ = pair
    # an idle-allocation alert on a job whose shard b owns, fired (and stored) by b alone
    job = next(f"job-{i}" for i in range(500) if shard_of("job", f"job-{i}", SHARDS) in b.member.node.owned)
    now = time.time()
    alert = Alert(
        b.member.state.next_id(),
        "gpu_idle_allocated",
        "P3",
        "ml",
        {"job": job, "node": "n", "gpu": "0"},
        now - 3600,
        "idle",
        b.hub.alerts.price_per_gpu_hour,
    )
    assert b.member.state.fired(alert, None, now) is None
    assert a.hub.store.alerts() == [] and b.hub.store.alerts() == []  # no member keeps a local copy
    for member in (a, b):
        idle = reports_view(member.hub, now, 86400.0)["idle_allocated"]
        assert idle["by_job"] == {job: pytest.approx(1.0, abs=0.01)}, member.member.cfg.hub_id


def test_the_cluster_alert_view_reads_only_what_changed(pair: tuple[Member, Member, Sink]) -> None:
    a, b, _ = pair
    state = a.member.state
    state.view()
    start = state.rows_read
    now = time.time()
    fired = []
    for i, node in enumerate(_nodes_of(b, 3)):
        alert = Alert(b.member.state.next_id(), RULE, "P1", "platform", {"node": node}, now + i, "dbe", 0.0)
        assert b.member.state.fired(alert, None, now + i) is None
        fired.append(alert)
    assert [x.id for x in state.view()[0]] == [x.id for x in fired]
    assert state.rows_read - start == 3
    fired[0].resolved_at = now + 10
    assert b.member.state.resolved(fired[0], now + 10)
    alerts, incidents = state.view()
    assert state.rows_read - start == 4  # the one row that changed, not all of them again
    assert [x.resolved_at for x in alerts] == [now + 10, None, None]
    assert (alerts, incidents) == b.member.state.view()
