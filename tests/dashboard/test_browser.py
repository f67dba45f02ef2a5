"""Every dashboard page in real headless Chromium against a real hub serving a simulated run.

Chromium is conftest's ``browser``: skipped when it is absent outside CI; in CI (``CI=true``) its
absence is a failure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page

from dashboard.conftest import Served
from support import ARTIFACTS

# headless Chromium; without it the module is skipped before any hub is built
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("browser")]

SHOTS = ARTIFACTS / "dashboard"  # ignored by git
# page, hash, charts that must hold points
PAGES = [
    ("fleet", "#/fleet", []),
    ("alerts", "#/alerts", []),
    ("alert", "#/alert/al-1", []),
    ("gpu", "#/gpu/node-1/5", ["util", "temp", "power", "clock", "throttle", "ecc"]),
    ("node", "#/node/node-1", ["util", "temp", "power", "cpu", "net"]),
    ("jobs", "#/jobs", []),
    ("job", "#/job/llm-pretrain", ["loss", "grad_norm", "step_seconds"]),
    ("services", "#/services", []),
    ("service", "#/service/chat-api", ["latency", "ttft", "queue", "errors", "kv"]),
    ("reports", "#/reports", ["trend"]),
    ("lineage", "#/lineage", []),
]


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = ctx.new_page()
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(msg.text)

    p.on("console", on_console)
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    ctx.close()
    assert errors == [], f"console errors: {errors}"


def open_page(page: Page, served: Served, fragment: str, refresh: float = 60, query: str = "") -> None:
    page.goto(f"{served.url}/ui/?refresh={refresh}{query}{fragment}")
    page.wait_for_selector('body[data-ready="1"]', timeout=15_000)


@pytest.mark.parametrize(("name", "fragment", "charts"), PAGES, ids=[p[0] for p in PAGES])
def test_page_loads_with_data(
    page: Page, served: Served, name: str, fragment: str, charts: list[str]
) -> None:
    open_page(page, served, fragment)
    assert page.get_attribute("body", "data-page") == name
    assert not page.is_visible("#banner")
    for chart in charts:
        box = page.locator(f"#c-{chart}")
        assert int(box.get_attribute("data-points") or 0) > 0, f"{name}: chart {chart} has no points"
        assert box.locator("canvas").count() == 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_incidents_open_the_alerts_page_and_an_unknown_page_says_so(page: Page, served: Served) -> None:
    open_page(page, served, "#/incidents")
    assert page.get_attribute("body", "data-page") == "alerts"
    assert page.locator("h1").inner_text() == "Alerts and incidents"
    page.evaluate("location.hash = '#/nosuch'")
    page.wait_for_selector('body[data-page="missing"][data-ready="1"]', timeout=15_000)
    said = page.locator("#missing").inner_text()
    assert said.startswith("There is no page #/nosuch in this dashboard. Its pages are Fleet, Alerts")
    assert not page.is_visible("#banner")


def test_fleet_heatmap_paints_faulty_gpus_in_fault_colours(page: Page, served: Served) -> None:
    open_page(page, served, "#/fleet")

    def colour(node: str, gpu: str) -> str:
        cell = page.locator(f'.cell[data-node="{node}"][data-gpu="{gpu}"]')
        return str(cell.evaluate("el => getComputedStyle(el).backgroundColor"))

    assert colour("node-2", "6") == "rgb(229, 72, 77)"  # P1: fell off the bus
    assert colour("node-1", "5") == "rgb(245, 165, 36)"  # P2: thermal throttle
    healthy = colour("node-0", "0")
    assert healthy not in {"rgb(229, 72, 77)", "rgb(245, 165, 36)"}
    assert page.locator(".cell").count() == 32
    assert page.locator(".cell.idle").count() >= 4
    page.select_option("#f-metric", "gpu_temp_celsius")
    page.wait_for_function("() => document.querySelector('#f-lo').textContent !== '0'")
    assert colour("node-1", "5") == "rgb(245, 165, 36)"


def test_ack_from_the_alerts_page(page: Page, served: Served) -> None:
    open_page(page, served, "#/alerts")
    page.fill("#user", "ops-alice")
    page.dispatch_event("#user", "change")
    row = page.locator('tr[data-alert="al-1"]')
    assert row.get_attribute("data-acked") == "0"
    row.locator("button.ack").click()
    page.wait_for_selector('tr[data-alert="al-1"][data-acked="1"]', timeout=10_000)
    assert "acked by ops-alice" in page.locator('tr[data-alert="al-1"] .ackstate').inner_text()
    alerts = httpx.get(f"{served.url}/api/v1/alerting/alerts").json()["alerts"]
    assert next(a for a in alerts if a["id"] == "al-1")["ack"]["by"] == "ops-alice"


def test_live_update_without_reload(page: Page, served: Served) -> None:
    open_page(page, served, "#/alerts", refresh=1)
    page.evaluate("window.__sameDocument = true")
    res = httpx.post(f"{served.url}/api/v1/alerts/al-5/ack", json={"by": "ops-bob"})
    assert res.status_code == 200
    page.wait_for_selector('tr[data-alert="al-5"][data-acked="1"]', timeout=10_000)
    assert page.evaluate("window.__sameDocument") is True


def test_links_from_alert_to_job_rank_node_gpu(page: Page, served: Served) -> None:
    straggler = next(a for a in served.hub.alerts.all() if a.rule == "training_straggler")
    rank = straggler.entity["rank"]
    open_page(page, served, f"#/alert/{straggler.id}")
    page.click(f'a[href="#/job/llm-pretrain/{rank}"]')
    page.wait_for_selector('body[data-page="job"][data-ready="1"]')
    assert page.locator(f'tr.straggler[data-rank="{rank}"]').count() == 1
    node, gpu = straggler.entity["node"], straggler.entity["gpu"]
    page.locator(f'tr[data-rank="{rank}"] a[href="#/node/{node}"]').click()
    page.wait_for_selector('body[data-page="node"][data-ready="1"]')
    page.locator(f'#n-gpus a[href="#/gpu/{node}/{gpu}"]').click()
    page.wait_for_selector('body[data-page="gpu"][data-ready="1"]')
    assert f"GPU {gpu}" in page.locator("h1").inner_text()


def test_time_range_picker_redraws(page: Page, served: Served) -> None:
    open_page(page, served, "#/job/llm-pretrain")
    before = int(page.get_attribute("body", "data-updates") or 0)
    page.select_option("#range", "900")
    page.wait_for_function(f"() => Number(document.body.dataset.updates) > {before}")
    assert int(page.locator("#c-loss").get_attribute("data-points") or 0) > 0


def test_lineage_page_draws_run_checkpoint_version_deployment(page: Page, served: Served) -> None:
    api = f"{served.url}/api/v1/lineage"
    for path, body in [
        ("runs", {"job": "llm-pretrain", "meta": {"owner": "research"}}),
        (
            "checkpoints",
            {"job": "llm-pretrain", "step": 120, "manifest_hash": "ab" * 32, "path": "/ckpt/120"},
        ),
        (
            "versions",
            {
                "model": "chat",
                "version": "v8",
                "job": "llm-pretrain",
                "step": 120,
                "metrics": {"eval_loss": 1.9},
            },
        ),
        ("promotions", {"service": "chat-api", "model": "chat", "version": "v8", "alias": "champion"}),
    ]:
        r = httpx.post(f"{api}/{path}", json=body, timeout=10)
        assert r.status_code == 200, r.text
    open_page(page, served, "#/lineage")
    row = page.locator('[data-version="chat:v8"]')
    row.wait_for(timeout=10_000)
    text = row.inner_text()
    assert "llm-pretrain" in text and "step 120" in text and "@champion" in text and "chat-api" in text


def test_node_to_gpu_within_100_ms_shows_the_gpu_page_without_an_error(page: Page, served: Served) -> None:
    """Seen: an error banner and the node's charts under the GPU's title until the next refresh."""
    page.goto(f"{served.url}/ui/?refresh=60#/node/node-1")
    page.wait_for_timeout(100)
    page.evaluate("location.hash = '#/gpu/node-1/5'")
    page.wait_for_selector('body[data-page="gpu"][data-ready="1"]', timeout=15_000)
    assert not page.is_visible("#banner")
    assert page.locator("#g-now .card").count() >= 5
    assert page.inner_text("#c-util .title") == "utilization %"  # the GPU's chart, not the node's
    assert page.locator("#n-gpus").count() == 0


def test_node_page_names_each_service_once_and_timelines_read_as_words(page: Page, served: Served) -> None:
    open_page(page, served, "#/node/node-3")
    assert page.locator(".serves").all_inner_texts() == ["serves chat-api"]
    open_page(page, served, "#/gpu/node-2/6")
    timeline = page.inner_text("#g-events")
    assert "xid 79" in timeline and "{" not in timeline and '"' not in timeline


def test_reports_trend_axis_spans_the_report_window(page: Page, served: Served) -> None:
    """Seen: one dot on an axis running from 2027 to 2029, y up to 150 %."""
    open_page(page, served, "#/reports", query="&range=2592000")
    x0, x1, y0, y1 = page.evaluate(
        "(() => { const u = GS.charts.get('c-trend').u;"
        " return [u.scales.x.min, u.scales.x.max, u.scales.y.min, u.scales.y.max]; })()"
    )
    now = time.time()
    assert now - 30 * 86400 - 600 <= x0 < x1 <= now
    assert (y0, y1) == (0, 100)
    ticks = page.locator("#c-trend .u-axis").first.inner_text()
    assert "2027" not in ticks and "2029" not in ticks


def test_the_range_picker_sets_the_reports_range(page: Page, served: Served) -> None:
    """Seen: "Reports · last 30 days" whatever range was picked."""
    open_page(page, served, "#/reports", query="&range=2592000")
    assert page.inner_text("#r-title") == "Reports · last 30 days"
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/v1/ui/reports" in r.url else None)
    page.select_option("#range", "604800")
    page.wait_for_function("() => document.querySelector('#r-title').textContent.endsWith('7 days')")
    assert page.inner_text("#r-title") == "Reports · last 7 days"
    assert any("range=604800" in url for url in asked)
    x0, x1 = page.evaluate("(({ min, max }) => [min, max])(GS.charts.get('c-trend').u.scales.x)")
    now = time.time()
    assert x1 <= now and x1 - x0 == pytest.approx(7 * 86400, abs=1)
    assert page.inner_text("#c-trend .title").endswith("daily mean")
    # an hour is drawn in five-minute steps, not as one daily dot
    page.select_option("#range", "3600")
    page.wait_for_function("() => document.querySelector('#r-title').textContent.endsWith('1 hour')")
    x0, x1 = page.evaluate("(({ min, max }) => [min, max])(GS.charts.get('c-trend').u.scales.x)")
    assert x1 - x0 == pytest.approx(3600, abs=1)
    assert page.inner_text("#c-trend .title").endswith("5-minute mean")


def test_reports_chart_the_scheduler_s_demand_and_capacity(page: Page, slurm_served: Served) -> None:
    open_page(page, slurm_served, "#/reports", query="&range=2592000")
    row = page.locator('#r-sched-table tr[data-partition="debug"]')
    assert row.locator("td").all_inner_texts()[1:] == ["1 s", "1 s", "3", "3", "0", "0"]
    box = page.locator('[data-chart="sched-debug"]')
    assert int(box.get_attribute("data-points") or 0) == 8 and box.locator("canvas").count() == 1


def test_lineage_lists_a_checkpoint_once_with_the_ranks_that_reported_it(page: Page, served: Served) -> None:
    """Seen: 16 identical checkpoint_completed rows, one per rank."""
    now = time.time()
    events = [
        {
            "ts": now - 5 + rank / 100,
            "kind": "checkpoint_completed",
            "labels": {"job": "ckpt-once", "rank": str(rank), "node": "node-0", "gpu": str(rank)},
            "data": {"step": 40, "seconds": 3.5, "bytes": 1e9},
        }
        for rank in range(4)
    ]
    batch = {"source": "sdk:ckpt-once", "batch_id": f"ckpt-once:{now}", "events": events}
    assert httpx.post(f"{served.url}/api/v1/ingest", json=batch, timeout=10).status_code == 200
    open_page(page, served, "#/lineage")
    rows = page.locator("#l-events tr", has_text="ckpt-once")
    assert rows.count() == 1
    assert "job ckpt-once ranks 0–3" in rows.inner_text()


def test_the_service_page_shows_kv_cache_use_in_percent_as_the_services_list_does(
    page: Page, served: Served
) -> None:
    """Seen: 40.5 % on the Services page, a 0.4-0.55 "used share" on the service's chart."""
    open_page(page, served, "#/service/chat-api")
    assert page.inner_text("#c-kv .title") == "KV cache used %"
    used = page.evaluate("GS.charts.get('c-kv').u.data[1].filter((v) => v !== null)")
    assert used and max(used) > 1 and max(used) <= 100


def test_throttle_reasons_are_drawn_in_percent_of_time_on_a_fixed_scale(page: Page, served: Served) -> None:
    """Seen: the same "share of time" chart scaled 0-100 on one GPU and 0-1 on another."""
    open_page(page, served, "#/gpu/node-1/5")  # thermally throttled in the replayed scenario
    assert page.inner_text("#c-throttle .title") == "throttle reasons (% of time)"
    scale = page.evaluate("(({ min, max }) => [min, max])(GS.charts.get('c-throttle').u.scales.y)")
    assert scale == [0, 100]
    drawn = page.evaluate("GS.charts.get('c-throttle').u.data.slice(1).flat().filter((v) => v !== null)")
    assert max(drawn) > 1  # a throttled stretch reads as a percentage, not a 0-1 share


def test_the_fleet_page_names_the_team_that_must_act(page: Page, served: Served) -> None:
    """Seen: no owner or team anywhere on the Fleet page; only the Alerts page named one."""
    firing = served.hub.firing()
    open_page(page, served, "#/fleet")
    owners = {a.owner for a in firing}
    assert owners and page.locator("#f-owner-table tr[data-owner]").count() == len(owners)
    for owner in owners:
        mine = [a for a in firing if a.owner == owner]
        cells = page.locator(f'#f-owner-table tr[data-owner="{owner}"] td').all_inner_texts()
        counted = {t: sum(1 for a in mine if a.severity == t) for t in ("P1", "P2", "P3")}
        assert cells[1:4] == [f"{t} {n}" if n else "–" for t, n in counted.items()]
        assert all(a.rule in cells[5] for a in mine)
    # the idle allocation's GPUs name the owner of the rule they raise, as its alert does
    idle_owner = next(a.owner for a in firing if a.rule == "gpu_idle_allocated")
    rows = page.locator("#f-idle-table tr", has_text="eval-sweep")
    assert rows.count() == 4
    assert set(rows.locator("td.owner").all_inner_texts()) == {idle_owner}
