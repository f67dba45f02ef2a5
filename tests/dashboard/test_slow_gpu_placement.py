"""One GPU slow from its start, detector to page: a simulated 8-GPU job whose node-1 GPU 1 (rank 5)
is a slower part from the first step, replayed through the real simulator, hub, detectors, alert
engine and alerting service (``fixtures/slow-gpu.yaml``). What a person concludes: one incident,
rooted at that GPU, a P3 with its cost (the command line and the Alerts page say so); the job page
names the GPU, the rank on it and what it costs the job, and calls it no live fault (no straggler,
no slow GPU alert). Real headless Chromium, as the other dashboard tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from playwright.sync_api import Page

from dashboard.conftest import Served, serve_replay
from gpuscope.cli import main
from gpuscope.model import Alert

# headless Chromium; without it the module is skipped before the replay is served
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "slow-gpu.yaml"
GPU = {"job": "pretrain", "node": "node-1", "gpu": "1"}  # rank 5, with 4 GPUs a node
SLOWDOWN = 1.08  # the fixture's: its clock runs 1 / 1.08 of the others'
LIVE_FAULTS = ("gpu_underperforming", "training_straggler", "step_time_regression")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from serve_replay(SCENARIO)


def open_page(page: Page, served: Served, fragment: str) -> None:
    page.goto("about:blank")  # a whole load: a hash-only navigation would find the last page ready
    page.goto(f"{served.url}/ui/?refresh=60{fragment}")
    page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
    assert not page.is_visible("#banner"), page.inner_text("#banner")


def gpu_placement(served: Served) -> Alert:
    (placed,) = [a for a in served.hub.alerts.all() if a.rule == "slow_placement" and "gpu" in a.entity]
    return placed


def test_one_slow_gpu_is_one_incident_rooted_at_that_gpu(
    served: Served, page: Page, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = gpu_placement(served)
    assert placed.entity == GPU and placed.firing and placed.severity == "P3"
    assert not [a.rule for a in served.hub.alerts.all() if a.rule in LIVE_FAULTS]

    assert main(["incidents", "--hub", served.url, "--json", "--all"]) == 0
    incidents = orjson.loads(capsys.readouterr().out)["incidents"]
    (incident,) = incidents  # every alert of the job is in it: one cause, one incident
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

    open_page(page, served, "#/alerts")
    (row,) = page.locator("#a-inc tr[data-incident]").all()
    assert row.get_attribute("data-incident") == incident["id"] and row.get_attribute("data-state") == "open"
    root = row.locator("td:nth-child(2)")
    assert root.inner_text().startswith("P3 slow_placement")
    assert root.locator('a[href="#/gpu/node-1/1"]').count() == 1  # the root cause is that GPU
    assert f"{incident['id']} slow_placement on node-1 GPU 1" in row.locator("td:nth-child(1)").inner_text()


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
