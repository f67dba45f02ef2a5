"""A hub's base URL as a user types it (``--hub``, ``GPUSCOPE_HUB``, an SDK's ``hub=``): checked
before anything is sent, so that ``hub.example:8080`` is refused by name instead of reaching httpx
as the unknown protocol ``hub.example://``.

Standard library only: the SDK (base install) uses it as well as the command line.
"""

from __future__ import annotations

import argparse

SCHEMES = ("http://", "https://")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a hub's base URL, or ``None`` when it can."""
    if not url.startswith(SCHEMES):
        hint = f"; e.g. http://{url}" if "://" not in url and url else ""
        return f"the scheme is required: a hub URL must start with http:// or https:// (got {url!r}{hint})"
    if not url.split("://", 1)[1].strip("/"):
        return f"a hub URL names a host after its scheme (got {url!r})"
    return None


def split_urls(value: str) -> list[str]:
    """The hub URLs of a comma-separated list, without trailing slashes; ``ValueError`` naming the
    first that is not one."""
    urls = [u.strip() for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError(url_problem(value.strip()) or f"no hub URL in {value!r}")
    for url in urls:
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(problem)
    return [url.rstrip("/") for url in urls]


def hub_url(value: str) -> str:
    """argparse ``type`` of an option holding one hub URL: its error names the option."""
    problem = url_problem(value.strip())
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def hub_urls(value: str) -> str:
    """argparse ``type`` of an option holding hub URLs separated by commas (kept as typed)."""
    try:
        split_urls(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value
