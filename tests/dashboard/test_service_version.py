"""The service page's version is the one serving now, the one ``version_regression`` blames.

Seen: the version card said ``v7`` while the version timeline and a firing P2
``version_regression`` named ``v8``. Real hub, real headless Chromium.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from dashboard.conftest import Served, serve_replay

# headless Chromium; without it the module is skipped before the scenario is replayed
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SCENARIO = Path(__file__).parent / "fixtures" / "bad-version.yaml"


@pytest.fixture(scope="module")
def rolled_out() -> Iterator[Served]:
    yield from serve_replay(SCENARIO)


def blamed(served: Served) -> list[str]:
    return [a.entity["version"] for a in served.hub.firing() if a.rule == "version_regression"]


def test_the_service_api_names_the_version_the_regression_blames(rolled_out: Served) -> None:
    assert blamed(rolled_out) == ["v8"]
    with httpx.Client(base_url=rolled_out.url, timeout=10) as client:
        body = client.get("/api/v1/ui/service", params={"service": "chat-api"}).json()
        listed = client.get("/api/v1/ui/services").json()["services"]
    serving = body["serving"]
    assert (serving["version"], serving["source"], serving["reported"]) == ("v8", "promotion", ["v8"])
    assert serving["since"] == pytest.approx(rolled_out.t0 + 130, abs=1.5)
    assert body["versions"][0] == "v8"  # newest report first; v7 served before the rollout
    assert [s["serving"]["version"] for s in listed if s["service"] == "chat-api"] == ["v8"]


def test_the_service_page_card_shows_the_version_serving_now(rolled_out: Served, page: Page) -> None:
    page.goto(f"{rolled_out.url}/ui/?refresh=60#/service/chat-api")
    page.wait_for_selector('body[data-ready="1"]', timeout=15_000)
    assert page.inner_text("#sv-version") == "v8"
    assert page.locator("#sv-reported").count() == 0  # the reports agree
    alert = page.locator("#sv-alerts tr", has_text="version_regression")
    assert "v8" in alert.inner_text()
    page.goto(f"{rolled_out.url}/ui/?refresh=60#/services")
    page.wait_for_selector('body[data-page="services"][data-ready="1"]', timeout=15_000)
    assert page.inner_text('tr[data-service="chat-api"] td.version') == "v8"


def test_a_promotion_the_reports_do_not_name_yet_is_shown_as_such(rolled_out: Served, page: Page) -> None:
    """A promotion through the lineage API (as ``gpuscope lineage promote`` makes) is what serves
    now; the card says the service's reports still name v8."""
    api = f"{rolled_out.url}/api/v1/lineage"
    for path, body in [
        ("checkpoints", {"job": "chat-train", "step": 300, "manifest_hash": "cd" * 32}),
        ("versions", {"model": "chat", "version": "v9", "job": "chat-train", "step": 300}),
        ("promotions", {"service": "chat-api", "model": "chat", "version": "v9", "traffic_share": 0.1}),
    ]:
        r = httpx.post(f"{api}/{path}", json=body, timeout=10)
        assert r.status_code == 200, r.text
    page.goto(f"{rolled_out.url}/ui/?refresh=60#/service/chat-api")
    page.wait_for_selector('body[data-ready="1"]', timeout=15_000)
    assert page.inner_text("#sv-version") == "v9"
    card = page.locator(".card", has=page.locator("#sv-version")).inner_text()
    assert "10 % of traffic" in card
    assert page.inner_text("#sv-reported") == "reports name v8"
