"""The job page marks a rank whose ``rank_lost`` alert is firing in its rank table (it marked
stragglers only, so the dead rank read like any other), and says when no checkpoint was started
(it drew an empty, unlabelled timeline); an idle job counts the ranks it placed. Real headless
Chromium, real hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from dashboard.conftest import Served, replay
from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer

# headless Chromium; without it the module is skipped before the scenario is replayed
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "rank-lost.yaml"


@pytest.fixture(scope="module")
def dropped() -> Iterator[Served]:
    hub = Hub(DuckDBStore(":memory:", durable=False), price_per_gpu_hour=2.5)
    t0 = replay(hub, SCENARIO)
    server = HubServer(hub, "127.0.0.1", 0)
    server.evaluator.stop()  # judged in the replay's time only (see test_stall_agreement)
    server.start()
    try:
        yield Served(hub, server, t0)
    finally:
        server.stop()


def test_the_job_page_marks_the_rank_the_alert_says_is_lost(dropped: Served, page: Page) -> None:
    lost = [a.entity["rank"] for a in dropped.hub.firing() if a.rule == "rank_lost"]
    assert lost == ["2"]
    page.goto(f"{dropped.url}/ui/?refresh=60#/job/llm-dropout")
    page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
    marked = page.locator("#jb-ranks tr.lost")
    assert marked.count() == 1
    assert marked.get_attribute("data-rank") == "2"
    assert marked.locator("td").first.inner_text() == "2 lost (silent)"
    assert page.locator("#jb-ranks tr.lost, #jb-ranks tr.straggler").count() == 1
    # the job saves every 600 s: no checkpoint yet, said in words rather than an empty timeline
    assert page.inner_text("#jb-ckpt") == "no checkpoint started in this range"


def test_an_idle_job_counts_the_ranks_it_placed_and_says_none_reported_a_step(
    dropped: Served, page: Page
) -> None:
    """Seen: "ranks 0" in the card above a table listing 4 ranks, for a job idling on its GPUs."""
    page.goto(f"{dropped.url}/ui/?refresh=60#/job/idle-hold")
    page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
    assert page.locator("#jb-ranks tr[data-rank]").count() == 4
    assert page.inner_text("#jb-nranks") == "4"
    assert page.inner_text("#jb-stepping") == "0 reporting steps in this range"
    assert page.inner_text("#jb-good") == "no steps in this range"
