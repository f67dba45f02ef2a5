"""What a person concludes from each page agrees with the alerts: a slow placement reads as a P3 with
its cost on a running job (no straggler, no live fault), the GPU wearing out is named where GPUs
are ranked, resolved alerts read as resolved wherever alerts are listed, and every alert's tier and
owner are the rule table's. Real headless Chromium against a real hub replaying
``fixtures/agreement.yaml`` (the live stall is ``test_stall_agreement.py``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from dashboard.conftest import Served, open_page, serve_replay
from gpuscope.hub import Hub
from gpuscope.model import Alert, Batch, Event, Finding, TrainingRecord
from gpuscope.rules import spec
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer

# headless Chromium; without it the module is skipped before the replay is served
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "agreement.yaml"
STALE = "rgb(58, 63, 71)"  # --stale: the badge of a resolved alert


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from serve_replay(SCENARIO)


def alerts_of(served: Served, rule: str) -> list[Alert]:
    return [a for a in served.hub.alerts.all() if a.rule == rule]


def dollars(text: str) -> float:
    match = re.search(r"\$([0-9.]+)/h", text)
    assert match, text
    return float(match.group(1))


def test_a_slow_placement_reads_as_a_p3_with_its_cost_on_a_running_job(served: Served, page: Page) -> None:
    (placed,) = alerts_of(served, "slow_placement")
    assert placed.firing and placed.severity == spec("slow_placement").tier == "P3"
    assert not [a for a in alerts_of(served, "training_straggler") if a.entity["job"] == "mixed"]

    open_page(page, served, "#/jobs")
    assert page.get_attribute('tr[data-job="mixed"] td[data-status]', "data-status") == "running"

    open_page(page, served, "#/job/mixed")
    assert page.get_attribute("#jb-status", "data-status") == "running"
    assert page.inner_text("#jb-strag") == "none" and page.locator("tr.straggler").count() == 0
    row = page.locator(f'#jb-alerts tr[data-alert="{placed.id}"]')
    assert row.get_attribute("data-state") == "firing"
    assert row.locator(".sev").inner_text() == "P3"
    assert dollars(row.inner_text()) == pytest.approx(placed.cost_per_hour, rel=0.01)
    assert placed.cost_per_hour > 0
    # the ranks the alert names are shown as the job's slower group, not as stragglers
    assert page.inner_text("#jb-placement").startswith("P3")
    assert "not a live fault" in page.inner_text("#jb-cards")
    marked = [int(r.get_attribute("data-rank") or -1) for r in page.locator("tr.slowgroup").all()]
    assert marked == sorted(placed.details["slow_ranks"]) == [4, 5, 6, 7]
    assert page.get_attribute("#jb-placement", "data-ranks") == "4,5,6,7"
    assert page.locator(".jb-placement-gpu").count() == 0  # no GPU of its own is slower than its group

    # its GPUs work at the job's pace: productive, no GPU fault
    open_page(page, served, "#/fleet")
    cells = page.locator('.cell[data-node="node-0"], .cell[data-node="node-1"]').all()
    assert len(cells) == 8
    for cell in cells:
        assert (cell.get_attribute("data-state"), cell.get_attribute("data-pstate")) == ("ok", "productive")


def test_the_gpu_wearing_out_is_named_on_reports_fleet_and_its_own_page(served: Served, page: Page) -> None:
    (risk,) = alerts_of(served, "gpu_failure_risk")
    assert risk.firing and (risk.entity["node"], risk.entity["gpu"]) == ("node-2", "2")

    open_page(page, served, "#/reports")
    first = page.locator("#r-fail tr[data-candidate]").first
    assert first.get_attribute("data-candidate") == "node-2/2"
    assert "gpu_failure_risk" in first.inner_text()

    on_gpu = [
        a for a in served.hub.firing() if a.entity.get("node") == "node-2" and a.entity.get("gpu") == "2"
    ]
    worst = min(a.severity for a in on_gpu)  # "P1" < "P2" < "P3"
    open_page(page, served, "#/fleet")
    assert page.get_attribute('.cell[data-node="node-2"][data-gpu="2"]', "data-state") == worst

    open_page(page, served, "#/gpu/node-2/2")
    row = page.locator(f'#g-alerts tr[data-alert="{risk.id}"]')
    assert row.get_attribute("data-state") == "firing" and row.locator(".sev").inner_text() == risk.severity


def test_resolved_alerts_read_as_resolved_on_every_page_that_lists_them(served: Served, page: Page) -> None:
    """Seen: the GPU and service pages listed resolved alerts with their P1/P2 badge and no state,
    and the job page still marked a rank whose straggler alert had resolved."""
    (latency,) = alerts_of(served, "inference_latency_regression")
    assert not latency.firing

    open_page(page, served, "#/services")
    assert page.locator('tr[data-service="chat-api"] td').last.inner_text() == "–"
    open_page(page, served, "#/service/chat-api")
    row = page.locator(f'#sv-alerts tr[data-alert="{latency.id}"]')
    assert row.get_attribute("data-state") == "resolved" and "resolved" in row.inner_text()
    assert row.locator(".sev").evaluate("el => getComputedStyle(el).backgroundColor") == STALE

    gpu_alerts = [
        a for a in served.hub.alerts.all() if (a.entity.get("node"), a.entity.get("gpu")) == ("node-2", "2")
    ]
    assert {a.firing for a in gpu_alerts} == {True, False}
    open_page(page, served, "#/gpu/node-2/2")
    shown = {
        str(r.get_attribute("data-alert")): r.get_attribute("data-state")
        for r in page.locator("#g-alerts tr[data-alert]").all()
    }
    assert shown == {a.id: "firing" if a.firing else "resolved" for a in gpu_alerts}
    states = page.locator("#g-alerts tr[data-alert]").evaluate_all("rows => rows.map((r) => r.dataset.state)")
    assert states == sorted(states, key=lambda s: s != "firing")  # what is firing comes first

    stragglers = [a for a in alerts_of(served, "training_straggler") if a.entity["job"] == "pretrain"]
    assert stragglers and not any(a.firing for a in stragglers)
    open_page(page, served, "#/job/pretrain")
    assert page.inner_text("#jb-strag") == "none" and page.locator("tr.straggler").count() == 0
    assert f"rank {stragglers[0].entity['rank']}" in page.inner_text("#jb-strag-earlier")


def test_tiers_and_owners_on_the_alerts_page_are_the_rule_table_s(served: Served, page: Page) -> None:
    every = served.hub.alerts.all()
    assert {a.firing for a in every} == {True, False}
    open_page(page, served, "#/alerts")
    firing = {a.id for a in every if a.firing}
    incidents = httpx.get(f"{served.url}/api/v1/alerting/incidents", params={"state": "open"}).json()
    over = [i for i in incidents["incidents"] if i["root"] not in firing]
    assert over  # an open incident whose first alert has resolved
    for incident in over:  # seen: the root cause cell held its bare id, as if unknown
        cell = page.locator(f'#a-inc tr[data-incident="{incident["id"]}"] td').nth(1)
        assert cell.inner_text() == f"{incident['root']} resolved"
    page.select_option("#a-state", "all")
    page.wait_for_function(
        f"() => document.querySelectorAll('#a-list tr[data-alert]').length === {len(every)}"
    )
    for alert in every:
        rule = spec(alert.rule)
        # a rule escalates only where its meaning says so ("... P2 when ...")
        assert alert.severity == rule.tier or f"{alert.severity} when" in rule.meaning, alert
        row = page.locator(f'#a-list tr[data-alert="{alert.id}"]')
        assert row.locator(".sev").inner_text() == alert.severity
        assert row.locator("td:nth-child(2) .muted").inner_text() == f"{alert.id} · {rule.owner}"
        assert row.get_attribute("data-state") == ("firing" if alert.firing else "resolved")
    incidents = httpx.get(f"{served.url}/api/v1/alerting/incidents", params={"state": "all"}).json()
    assert any(i["resolved_at"] for i in incidents["incidents"])
    for incident in incidents["incidents"]:
        state = page.get_attribute(f'#a-inc tr[data-incident="{incident["id"]}"]', "data-state")
        assert state == ("resolved" if incident["resolved_at"] else "open")


def test_a_slow_gpu_and_a_slow_group_of_ranks_are_both_shown_on_the_jobs_page(page: Page) -> None:
    """Seen: the job page read only the first slow_placement and only its ranks, so a GPU slower
    than its speed group read as a placement of no ranks, and one kind hid the other."""
    hub = Hub(DuckDBStore(":memory:", durable=False), price_per_gpu_hour=2.5)
    now = time.time()
    place = [[r, "node-0", str(r)] for r in range(4)]
    started = Event(now - 300, "job_started", {"job": "p"}, {"kind": "training", "placement": place})
    rows = [TrainingRecord(now - 200 + s, "p", r, s, {"loss": 1.0}) for s in range(100) for r in range(4)]
    hub.ingest(Batch("sdk", events=[started], training=rows))
    gpu = Finding(
        "slow_placement",
        {"job": "p", "node": "node-0", "gpu": "2"},
        "node-0 GPU 2 has run 6.4% slower than the other GPUs of its speed group in job p since it started",
        value=0.064,
        affected_gpus=4,
        at_risk=0.064,
        details={"lag_share": 0.064, "lost_share": 0.064},
    )
    ranks = Finding(
        "slow_placement",
        {"job": "p"},
        "Job p has run at two speeds since it started: ranks 0-1 are 30% of a step slower",
        value=0.23,
        affected_gpus=4,
        at_risk=0.23,
        details={"slow_ranks": [0, 1], "lost_share": 0.23},
    )
    for t in (now - 900, now - 400, now):  # past any pending hold of the rule
        hub.alerts.update(t, [gpu, ranks])
    server = HubServer(hub, "127.0.0.1", 0, evaluate_interval=None)
    server.start()
    try:
        open_page(page, Served(hub, server, now), "#/job/p")
        assert page.get_attribute("#jb-placement", "data-ranks") == "0,1"
        assert page.inner_text("#jb-placement").startswith("P3")
        (slow_gpu,) = page.locator(".jb-placement-gpu").all()
        assert (slow_gpu.get_attribute("data-node"), slow_gpu.get_attribute("data-gpu")) == ("node-0", "2")
        assert slow_gpu.get_attribute("data-ranks") == "2"
        said = slow_gpu.inner_text()
        assert said.startswith("P3") and "node-0 GPU 2 6.4 % slower than its speed group" in said
        cards = page.inner_text("#jb-cards")
        assert "rank 2 on it" in cards and "not a live fault" in cards
        marked = [int(r.get_attribute("data-rank") or -1) for r in page.locator("tr.slowgroup").all()]
        assert marked == [0, 1, 2]  # the slower group's ranks and the rank on the slow GPU
    finally:
        server.stop()
        hub.store.close()
