"""The dashboard on a hub that wants a token for reads: the page loads, asks for the token, and
reads with it once given (real headless Chromium: conftest's ``browser``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from gpuscope.hub import Hub
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.auth import parse_auth
from gpuscope.web.server import HubServer

READ_T = "dashboard-read-token-0123"


@pytest.fixture
def strict_hub() -> Iterator[HubServer]:
    auth = parse_auth(
        {"tokens": [{"name": "wall", "scopes": ["read"], "token": READ_T}], "require_read_token": True}
    )
    server = HubServer(Hub(DuckDBStore(":memory:", durable=False)), "127.0.0.1", 0, auth=auth)
    server.start()
    yield server
    server.stop()


def test_the_page_asks_for_a_read_token_and_then_reads_with_it(
    browser: Browser, strict_hub: HubServer
) -> None:
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.goto(f"{strict_hub.url}/ui/#/fleet")
        page.wait_for_selector("body[data-ready='error']", timeout=15_000)
        assert "needs a token to read" in page.inner_text("#banner")
        page.fill("#token", READ_T)
        page.dispatch_event("#token", "change")
        page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        assert page.is_hidden("#banner")
        assert page.evaluate("sessionStorage.getItem('gs.token')") == READ_T
    finally:
        ctx.close()
