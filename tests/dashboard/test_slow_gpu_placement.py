"""One GPU slow from its start, detector to page: a simulated 8-GPU job whose node-1 GPU 1 (rank 5)
is a slower part from the first step, replayed through the real simulator, hub, detectors, alert
engine and alerting service (``fixtures/slow-gpu.yaml``). What a person concludes: one incident,
rooted at that GPU, a P3 with its cost (the command line and the Alerts page say so); the job page
names the GPU, the rank on it and what it costs the job, and calls it no live fault (no straggler,
no slow GPU alert). A part 1.2x slower from its start (``fixtures/faulty-gpu.yaml``), past what
parts of one model differ by, is a faulty part: one incident, a P2 rooted at that GPU with the
ranks' placement as its knock-on, and no placement of the GPU. Real headless Chromium, as the
other dashboard tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
import pytest
from playwright.sync_api import Locator, Page

from dashboard.conftest import Served, open_page, serve_replay
from gpuscope.cli import main
from gpuscope.model import Alert

# headless Chromium; without it the module is skipped before the replay is served
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "slow-gpu.yaml"
FAULTY = Path(__file__).parent / "fixtures" / "faulty-gpu.yaml"  # the same GPU, 1.2x slower
GPU = {"job": "pretrain", "node": "node-1", "gpu": "1"}  # rank 5, with 4 GPUs a node
SLOWDOWN = 1.08  # the fixture's: its clock runs 1 / 1.08 of the others'
LIVE_FAULTS = ("gpu_underperforming", "training_straggler", "step_time_regression")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from serve_replay(SCENARIO)


@pytest.fixture(scope="module")
def faulty() -> Iterator[Served]:
    yield from serve_replay(FAULTY)


def gpu_placement(served: Served) -> Alert:
    (placed,) = [a for a in served.hub.alerts.all() if a.rule == "slow_placement" and "gpu" in a.entity]
    return placed


def the_incident(served: Served, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The replay's one incident, as ``gpuscope incidents --json`` lists it: every alert of the job
    is in it (one cause, one incident)."""
    assert main(["incidents", "--hub", served.url, "--json", "--all"]) == 0
    (incident,) = orjson.loads(capsys.readouterr().out)["incidents"]
    return cast(dict[str, Any], incident)


def incident_row(page: Page, served: Served, incident: dict[str, Any]) -> Locator:
    """The Alerts page's row of ``incident``, checked open and alone, with its title."""
    open_page(page, served, "#/alerts")
    (row,) = page.locator("#a-inc tr[data-incident]").all()
    assert row.get_attribute("data-incident") == incident["id"] and row.get_attribute("data-state") == "open"
    assert f"{incident['id']} {incident['title']}" in row.locator("td:nth-child(1)").inner_text()
    return row


def test_one_slow_gpu_is_one_incident_rooted_at_that_gpu(
    served: Served, page: Page, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = gpu_placement(served)
    assert placed.entity == GPU and placed.firing and placed.severity == "P3"
    assert not [a.rule for a in served.hub.alerts.all() if a.rule in LIVE_FAULTS]

    incident = the_incident(served, capsys)
    assert incident["root"] == placed.id and incident["root_rule"] == "slow_placement"
    assert incident["root_entity"] == GPU and incident["tier"] == "P3"
    assert incident["title"].startswith("slow_placement on node-1 GPU 1")
    members = {a.id: a for a in served.hub.alerts.all() if a.id in incident["members"]}
    assert all(a.rule == "slow_placement" for a in members.values())
    # the ranks' own placement, when it fired, is a member naming the rank on that GPU
    for other in (a for a in members.values() if a.id != placed.id):
        assert other.details["slow_ranks"] == [5]
    # a synchronous job loses the slow GPU's lag once, however many alerts measured it
    assert incident["cost_per_hour"] == pytest.approx(placed.cost_per_hour, rel=0.01)

    root = incident_row(page, served, incident).locator("td:nth-child(2)")
    assert root.inner_text().startswith("P3 slow_placement")
    assert root.locator('a[href="#/gpu/node-1/1"]').count() == 1  # the root cause is that GPU


def test_the_job_page_shows_the_slow_gpu_with_its_cost(served: Served, page: Page) -> None:
    placed = gpu_placement(served)
    lag = 1.0 - 1.0 / SLOWDOWN
    view = httpx.get(f"{served.url}/api/v1/ui/job", params={"job": "pretrain", "start": served.t0}).json()
    (gpu,) = [p for p in view["slow_placements"] if p["kind"] == "gpu"]
    assert (gpu["node"], gpu["gpu"], gpu["ranks"]) == ("node-1", "1", [5])
    assert gpu["lag_share"] == pytest.approx(lag, abs=0.015)
    # its cost: the lag of every one of the job's 8 GPUs, at $2.50 an hour each
    assert (
        gpu["cost_per_hour"]
        == pytest.approx(placed.cost_per_hour)
        == pytest.approx(gpu["lag_share"] * 8 * 2.5, rel=0.01)
    )
    # rank 5 arrives last at every collective, but it is the GPU's pace, not a straggler (seen: the
    # page named it the straggler from the arrival skew, beside the P3 saying it is no live fault)
    assert view["stragglers"] == [] and view["status"] == "running"

    open_page(page, served, "#/job/pretrain")
    assert page.get_attribute("#jb-status", "data-status") == "running"
    assert page.inner_text("#jb-strag") == "none"
    (card,) = page.locator(".jb-placement-gpu").all()
    assert (card.get_attribute("data-node"), card.get_attribute("data-gpu")) == ("node-1", "1")
    assert card.get_attribute("data-ranks") == "5"
    said = card.inner_text()
    shown = re.search(r"node-1 GPU 1 ([0-9.]+) % slower than its speed group", said)
    assert said.startswith("P3") and shown, said
    assert float(shown.group(1)) == pytest.approx(100 * gpu["lag_share"], abs=0.1)
    cards = page.inner_text("#jb-cards")
    assert "rank 5 on it" in cards and "not a live fault" in cards
    marked = [r.get_attribute("data-rank") for r in page.locator("tr.slowgroup").all()]
    assert marked == ["5"] and page.locator("tr.straggler").count() == 0
    dollars = re.search(r"\$([0-9.]+)/h", cards)
    assert dollars and float(dollars.group(1)) == pytest.approx(placed.cost_per_hour, abs=0.01)
    row = page.locator(f'#jb-alerts tr[data-alert="{placed.id}"]')
    assert row.get_attribute("data-state") == "firing" and row.locator(".sev").inner_text() == "P3"


def test_a_gpu_faulty_from_its_start_pages_once_at_p2_with_its_ranks_placement_as_knock_on(
    faulty: Served, page: Page, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen before: a P3 placement of the GPU, a P3 of its ranks and a P2 gpu_underperforming, three
    alerts of two tiers for one part, the job's one pace costed twice in the incident."""
    alerts = faulty.hub.alerts.all()
    (broken,) = [a for a in alerts if a.rule == "gpu_underperforming"]
    assert broken.entity == {"node": "node-1", "gpu": "1"} and broken.severity == "P2" and broken.firing
    assert broken.details["since_start"] is True and "since it started" in broken.summary
    # the part's lag costs all 8 GPUs of the job, as a placement would (a 1.2x part: 14-17 %)
    assert 0.13 <= broken.details["lag_share"] <= 0.17
    assert broken.cost_per_hour == pytest.approx(broken.details["lag_share"] * 8 * 2.5, rel=0.01)
    assert not [a for a in alerts if a.rule == "slow_placement" and "gpu" in a.entity]
    (ranks,) = [a for a in alerts if a.rule == "slow_placement"]
    assert ranks.severity == "P3" and ranks.details["slow_ranks"] == [5]
    assert ranks.details["links"] == [{"node": "node-1", "gpu": "1"}]  # the GPU its slow rank runs on
    assert {a.rule for a in alerts} == {"gpu_underperforming", "slow_placement"}  # no straggler

    incident = the_incident(faulty, capsys)
    assert incident["root"] == broken.id and incident["root_rule"] == "gpu_underperforming"
    assert incident["root_entity"] == {"node": "node-1", "gpu": "1"} and incident["tier"] == "P2"
    assert incident["title"] == "gpu_underperforming on node-1 GPU 1 (+1 related)"
    assert sorted(incident["members"]) == sorted([broken.id, ranks.id])
    # one pace of one job, measured twice: the larger, not the sum
    assert incident["cost_per_hour"] == pytest.approx(max(broken.cost_per_hour, ranks.cost_per_hour))

    row = incident_row(page, faulty, incident)
    root = row.locator("td:nth-child(2)")
    assert root.inner_text().startswith("P2 gpu_underperforming")
    assert root.locator('a[href="#/gpu/node-1/1"]').count() == 1
    members = [a.inner_text() for a in row.locator("td:nth-child(3) a").all()]
    assert sorted(members) == sorted(incident["members"])  # the ranks' placement is in it, a member
    shown = {
        r.get_attribute("data-alert"): r.locator(".sev").inner_text()
        for r in page.locator("tr[data-alert]").all()
    }
    assert shown == {broken.id: "P2", ranks.id: "P3"}


def test_the_job_page_of_a_faulty_from_start_gpu_names_it_as_the_p2s_cause_and_blames_no_straggler(
    faulty: Served, page: Page
) -> None:
    """What a person reading the job page concludes: the job is degraded by a live fault, the P2 of
    node-1 GPU 1 (linked, "faulty part" in its summary), rank 5 on it slower since the start (the
    ranks' placement), and no rank is a straggler."""
    (broken,) = [a for a in faulty.hub.alerts.all() if a.rule == "gpu_underperforming"]
    view = httpx.get(f"{faulty.url}/api/v1/ui/job", params={"job": "pretrain", "start": faulty.t0}).json()
    assert view["stragglers"] == [] and view["status"] == "degraded"
    assert not [p for p in view["slow_placements"] if p["kind"] == "gpu"]

    open_page(page, faulty, "#/job/pretrain")
    assert page.get_attribute("#jb-status", "data-status") == "degraded"
    assert page.inner_text("#jb-strag") == "none" and page.locator("tr.straggler").count() == 0
    assert page.locator(".jb-placement-gpu").count() == 0
    assert page.get_attribute("#jb-placement", "data-ranks") == "5"
    row = page.locator(f'#jb-alerts tr[data-alert="{broken.id}"]')
    assert row.get_attribute("data-state") == "firing" and row.locator(".sev").inner_text() == "P2"
    assert row.locator('a[href="#/gpu/node-1/1"]').count() == 1  # the cause: that GPU
    said = row.inner_text()
    assert "node-1 GPU 1" in said and "since it started" in said and "faulty part" in said, said
    severities = [r.locator(".sev").inner_text() for r in page.locator("#jb-alerts tr[data-alert]").all()]
    assert sorted(severities) == ["P2", "P3"]  # the P2 and the ranks' placement, nothing else


def test_the_pages_of_a_faulty_from_start_gpu_say_which_gpu_its_lag_and_cost_as_its_alert_does(
    faulty: Served, page: Page, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without opening the alert, the job page names node-1 GPU 1 as slow since it started, a faulty
    part and not a slowdown, its lag behind its speed group and what it costs the job per hour; its
    GPU page and node page say the same. Every figure is the P2's own (its details, its cost) and
    the one incident's that ``gpuscope incidents --json`` lists, rooted at it. Seen before: the job
    page had only the P2's row among the job's alerts, its lag and cost in no line of their own."""
    (broken,) = [a for a in faulty.hub.alerts.all() if a.rule == "gpu_underperforming"]
    incident = the_incident(faulty, capsys)
    assert incident["root"] == broken.id
    lag = f"{100 * broken.details['lag_share']:.1f} % behind its speed group"
    dollars = f"${broken.cost_per_hour:.2f}/h"
    # the incident's cost is this part's (the ranks' placement measures the same pace, smaller)
    assert f"${incident['cost_per_hour']:.2f}/h" == dollars

    open_page(page, faulty, "#/job/pretrain")
    (card,) = page.locator(".jb-faulty-gpu").all()
    assert (card.get_attribute("data-node"), card.get_attribute("data-gpu")) == ("node-1", "1")
    assert card.get_attribute("data-ranks") == "5" and card.get_attribute("data-alert") == broken.id
    said = card.locator("xpath=..").inner_text()
    assert said.startswith("faulty GPU\nP2 node-1 GPU 1 slow since it started"), said
    assert lag in said and "a faulty part, not a slowdown" in said and "rank 5 on it" in said, said
    assert dollars in said and broken.id in said, said
    assert card.locator('a[href="#/gpu/node-1/1"]').count() == 1
    # the P2's own row among the job's alerts reads the same cost (it read $3.334/h beside $3.33/h)
    assert dollars in page.inner_text(f'#jb-alerts tr[data-alert="{broken.id}"]')

    open_page(page, faulty, "#/gpu/node-1/1")
    said = page.inner_text("#g-faulty")
    assert page.get_attribute("#g-faulty", "data-alert") == broken.id
    assert "P2 slow since it started" in said and lag + " in job pretrain" in said, said
    assert "a faulty part, not a slowdown" in said and dollars in said, said
    assert dollars in page.inner_text(f'#g-alerts tr[data-alert="{broken.id}"]')

    open_page(page, faulty, "#/node/node-1")
    (line,) = page.locator("p.faulty").all()
    assert line.get_attribute("data-gpu") == "1"
    said = line.inner_text()
    assert said.startswith("P2 GPU 1 slow since it started") and lag in said and dollars in said, said
