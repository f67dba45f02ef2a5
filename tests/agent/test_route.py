"""Which hub a sender posts to: the owner a hub names, the next known hub when one fails."""

from __future__ import annotations

import pytest

from gpuscope.agent.route import OWNER_HEADER, HubRoute, parse_hubs
from gpuscope.counters import Counters


def test_follows_the_named_owner_and_falls_back_through_known_hubs() -> None:
    counters = Counters()
    route = HubRoute(parse_hubs("http://a:7470/, http://b:7470"), "/api/v1/ingest", counters)
    assert route.url == "http://a:7470/api/v1/ingest"
    route.answered({})  # a single hub names nobody: stay
    route.answered({OWNER_HEADER: "http://a:7470"})  # already there
    assert route.base == "http://a:7470" and counters.get("hub_owner_moves") == 0
    route.answered({OWNER_HEADER: "http://c:7470/"})
    assert route.base == "http://c:7470" and counters.get("hub_owner_moves") == 1
    route.failed()  # c died: the configured hubs, in turn, then c again
    assert route.base == "http://a:7470"
    route.failed()
    assert route.base == "http://b:7470"
    route.failed()
    assert route.base == "http://c:7470"
    assert counters.get("hub_fallbacks") == 3


def test_a_tls_sender_never_follows_to_plain_text() -> None:
    counters = Counters()
    route = HubRoute(parse_hubs("https://a:7470"), "/api/v1/ingest", counters)
    route.answered({OWNER_HEADER: "http://b:7470"})
    route.answered({OWNER_HEADER: "ftp://b"})
    assert route.base == "https://a:7470" and counters.get("hub_owner_refused") == 2
    route.answered({OWNER_HEADER: "https://b:7470"})
    assert route.base == "https://b:7470"


@pytest.mark.parametrize("bad", ["", "hub:7470", "http://a:7470,hub:7470"])
def test_bad_hub_urls_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="must start with http"):
        parse_hubs(bad)
