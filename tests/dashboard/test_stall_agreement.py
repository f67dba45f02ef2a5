"""During a live stall every page tells the same story as the firing ``training_stalled`` alert.

Fleet colours the job's GPUs busy-but-not-productive and counts their GPU-hours, the jobs list and
the job page say ``stalled``, the job's GPU-time bar holds the stall, and Reports ranks the hang
first among the causes of waste. Real headless Chromium against a real hub; screenshots of the
Fleet page and the waste report go to ``test-artifacts/`` (ignored by git).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from dashboard.conftest import Served, replay
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import AlertingSettings
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import ARTIFACTS

# headless Chromium; without it the module is skipped before the stall is replayed
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "stall.yaml"
JOB = "llm-stuck"


@pytest.fixture(scope="module")
def stalled() -> Iterator[Served]:
    hub = Hub(DuckDBStore(":memory:", durable=False), price_per_gpu_hour=2.5)
    AlertingService(hub, AlertingSettings())
    t0 = replay(hub, SCENARIO)
    server = HubServer(hub, "127.0.0.1", 0)
    # no evaluation on the wall clock: under load the replay ends well before "now", and one late
    # evaluation would find every sender silent
    server.evaluator.stop()
    server.start()
    try:
        yield Served(hub, server, t0)
    finally:
        server.stop()


def open_page(page: Page, served: Served, fragment: str) -> None:
    page.goto(f"{served.url}/ui/?refresh=60{fragment}")
    page.evaluate("localStorage.setItem('gs.range', '900')")
    page.reload()
    page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
    assert not page.is_visible("#banner"), page.inner_text("#banner")


def test_every_page_agrees_with_the_firing_stall_alert(stalled: Served, page: Page) -> None:
    firing = {a.rule: a for a in stalled.hub.firing()}
    assert "training_stalled" in firing and firing["training_stalled"].entity["job"] == JOB
    gpus = [f"node-0/{g}" for g in range(8)]

    open_page(page, stalled, "#/fleet")
    for cell in gpus:
        node, gpu = cell.split("/")
        assert (
            page.get_attribute(f'.cell[data-node="{node}"][data-gpu="{gpu}"]', "data-pstate")
            == "busy_not_productive"
        )
        colour = page.locator(f'.cell[data-node="{node}"][data-gpu="{gpu}"]').evaluate(
            "el => getComputedStyle(el).backgroundColor"
        )
        assert colour == "rgb(255, 123, 114)"  # busy but not productive, not green
    assert page.get_attribute('.node[data-node="node-0"]', "data-worst") == "busy_not_productive"
    assert page.get_attribute('.node[data-node="node-1"]', "data-worst") == ""
    assert page.inner_text('#f-now [data-now="busy_not_productive"]') == "8"
    stall_hours = float(
        page.get_attribute('#f-hours tr[data-state="busy_not_productive"] td[data-hours]', "data-hours") or 0
    )
    assert stall_hours > 8 * 60 / 3600  # the stall has lasted over a minute on 8 GPUs
    assert "hung" in page.inner_text("#f-waste")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "fleet-stall.png"), full_page=True)

    open_page(page, stalled, "#/jobs")
    assert page.get_attribute(f'tr[data-job="{JOB}"] td[data-status]', "data-status") == "stalled"

    open_page(page, stalled, f"#/job/{JOB}")
    assert page.get_attribute("#jb-status", "data-status") == "stalled"
    width = page.locator('#jb-hoursbar span[data-state="busy_not_productive"]').evaluate(
        "el => el.style.width"
    )
    assert float(width.rstrip("%")) > 20.0

    open_page(page, stalled, "#/reports")
    assert page.get_attribute("#r-by-cause tr:nth-child(2)", "data-cause") == "hung"
    assert page.get_attribute("#r-by-job tr:nth-child(2)", "data-job") == JOB
    page.locator("#r-waste").screenshot(path=str(ARTIFACTS / "waste-report.png"))
    page.screenshot(path=str(ARTIFACTS / "reports-stall.png"), full_page=True)

    open_page(page, stalled, "#/alerts")
    assert "training_stalled" in page.inner_text("#main")
