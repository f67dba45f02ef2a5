"""Options and messages every command that talks to a running hub shares.

``--hub`` (default ``$GPUSCOPE_HUB``, else the local hub), ``--token`` and ``--json`` are accepted
both before and after a subcommand (``gpuscope alerts --json list`` and ``gpuscope alerts list
--json``): the copy on the subcommand has no default, so it only overrides when it is given.
"""

from __future__ import annotations

import argparse
import os

import httpx

from gpuscope.config import DEFAULT_PORT
from gpuscope.huburl import hub_url


def default_hub() -> str:
    return os.environ.get("GPUSCOPE_HUB") or f"http://127.0.0.1:{DEFAULT_PORT}"


def add_client_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """``--hub``, ``--token`` and ``--json`` on ``parser``; ``nested``: a subcommand's copy."""
    unset = argparse.SUPPRESS
    parser.add_argument(
        "--hub",
        type=hub_url,  # also checks $GPUSCOPE_HUB: argparse converts a default given as text
        default=unset if nested else default_hub(),
        help=f"hub URL (default: $GPUSCOPE_HUB, else http://127.0.0.1:{DEFAULT_PORT})",
    )
    parser.add_argument(
        "--token",
        default=unset if nested else os.environ.get("GPUSCOPE_TOKEN"),
        help="bearer token (default: $GPUSCOPE_TOKEN); writes need one, reads when the hub requires it",
    )
    parser.add_argument(
        "--json", action="store_true", default=unset if nested else False, help="print the hub's JSON answer"
    )


def add_verbose_option(parser: argparse.ArgumentParser) -> None:
    """``-v`` after a subcommand too (``gpuscope hub -v``); the top-level one holds the default."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log more")


def unreachable(hub: str, exc: httpx.HTTPError) -> str:
    """What went wrong reaching ``hub``, naming the URL that was tried."""
    return f"cannot reach the hub at {hub}: {str(exc) or type(exc).__name__}"


def error_message(response: httpx.Response) -> str:
    """The hub's error text, or a hint when the answer is not a gpuscope hub's JSON (an HTML page)."""
    try:
        body = response.json()
    except ValueError:
        status = response.status_code
        return f"the server at {response.url} answered HTTP {status} without JSON (is it a gpuscope hub?)"
    if isinstance(body, dict) and "error" in body:
        field = body.get("field")
        return f"{field}: {body['error']}" if field else str(body["error"])
    return response.text[:200]
