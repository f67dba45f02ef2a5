"""A real hub serving a simulated cluster: the data every dashboard test reads.

The scenario is replayed in virtual time so that it ends now (its last tick just before the
jobs end, so they still hold their GPUs), through the real ingest, detectors, alert engine and
alerting service; the hub then serves it over HTTP on a free loopback port. The evaluator is
stopped before the server starts so nothing fires or resolves while the browser looks.

The browser tests share one Chromium fixture, ``browser``: Debian's ``/usr/bin/chromium`` driven by
PyPI ``playwright`` (never ``playwright install``). Without it they are skipped, or fail in CI.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import AlertingSettings
from gpuscope.collect.slurm import SlurmCollector
from gpuscope.hub import Hub
from gpuscope.model import Batch
from gpuscope.sim.cluster import Simulator
from gpuscope.sim.scenario import load_scenario
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer
from support import need_binary

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCENARIO = Path(__file__).parent / "fixtures" / "dashboard.yaml"
SLURM = Path(__file__).parent.parent / "collect" / "fixtures" / "slurm"


@dataclass
class Served:
    hub: Hub
    server: HubServer
    t0: float

    @property
    def url(self) -> str:
        return self.server.url


def replay(hub: Hub, path: Path = SCENARIO) -> float:
    """Feed the scenario into ``hub`` so that its last tick lands at about now; returns its t0."""
    scenario = load_scenario(path)
    t0 = time.time() - scenario.duration
    for tick in Simulator(scenario, t0=t0).ticks():
        if tick.t >= scenario.duration - 1:
            break
        for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
            hub.ingest(batch)
        hub.evaluate(t0 + tick.t)
    return t0


def serve_replay(path: Path = SCENARIO) -> Iterator[Served]:
    """A hub that replayed ``path`` (its alerts triaged), served over HTTP until the generator ends."""
    hub = Hub(DuckDBStore(":memory:", durable=False), price_per_gpu_hour=2.5)
    alerting = AlertingService(hub, AlertingSettings())
    t0 = replay(hub, path)
    assert alerting.drain(60.0)  # the replay's alerts triaged, as a running hub's worker does
    server = HubServer(hub, "127.0.0.1", 0, alerting=alerting, evaluate_interval=None)  # replayed time
    server.start()
    try:
        yield Served(hub, server, t0)
    finally:
        server.stop()


def open_page(page: Page, served: Served, fragment: str) -> None:
    """Load the dashboard at ``fragment`` afresh (no hash-only navigation, which would find the last
    page ready) and wait until it is drawn, with no error banner."""
    page.goto("about:blank")
    page.goto(f"{served.url}/ui/?refresh=60{fragment}")
    page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
    assert not page.is_visible("#banner"), page.inner_text("#banner")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium for one test module (each module opens its own pages in it)."""
    need_binary("chromium", "chromium")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser: Browser) -> Iterator[Page]:
    """One page per module that fails the module's tests if the page threw a script error."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = ctx.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    ctx.close()
    assert errors == []


@pytest.fixture(scope="session")
def served() -> Iterator[Served]:
    yield from serve_replay()


@pytest.fixture
def slurm_served() -> Iterator[Served]:
    """A hub that kept four hourly rounds of the Slurm collector over a capture of slurm-wlm 22.05
    (partition debug: its one node of 2 GPUs drained, a job running after 1 s in the queue, one
    pending for 2 GPUs), served over HTTP."""
    pages = {
        "squeue": (SLURM / "squeue-22.05.json").read_text(),
        "sinfo": (SLURM / "sinfo-22.05-drained.json").read_text(),
    }
    hub = Hub(DuckDBStore(":memory:", durable=False))
    collector = SlurmCollector("login-1", run=lambda argv: pages[argv[0]])
    now = time.time()
    for hours_ago in (3, 2, 1, 0):
        got = collector.collect(now - hours_ago * 3600.0 - 60.0)
        hub.ingest(Batch("login-1", frames=got.frames))
    server = HubServer(hub, "127.0.0.1", 0, evaluate_interval=None)
    server.start()
    try:
        yield Served(hub, server, now - 3 * 3600.0)
    finally:
        server.stop()
        hub.store.close()
