"""An agent whose token the hub refuses says so once, clearly and without the token, and stops with
exit status 77 instead of running on while it delivers nothing; what it collected stays spooled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import orjson
import pytest

from gpuscope.agent.cli import EXIT_TOKEN_REFUSED
from gpuscope.agent.spool import Spool
from support import QuietHandler, loopback_http

TOKEN = "wrong-secret-token-0123456789"


class RefusingHub(QuietHandler):
    """Answers every ingest as the hub's auth guard does for a token it does not know (or none)."""

    posts: ClassVar[int] = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts += 1
        if self.headers.get("Authorization"):
            status, message = 403, "the token is not valid"
        else:
            status, message = 401, "a bearer token with scope 'ingest' is required to write"
        body = orjson.dumps({"error": message, "field": "authorization"})
        self.reply(status, body, "application/json")


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ([TOKEN], "refused the token (HTTP 403: authorization: the token is not valid)"),
        ([], "needs a token (HTTP 401: authorization: a bearer token with scope 'ingest' is required"),
    ],
    ids=["wrong token", "no token"],
)
def test_an_agent_refused_by_the_hub_says_why_once_and_exits_77(
    tmp_path: Path, token: list[str], said: str
) -> None:
    spool = tmp_path / "spool"
    with loopback_http(RefusingHub) as url:
        args = ["agent", "--hub", url, "--collector", "host", "--spool-dir", str(spool), "--interval", "0.2"]
        if token:
            args += ["--token", *token]
        done = subprocess.run(
            [sys.executable, "-m", "gpuscope.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "GPUSCOPE_TOKEN"},
        )
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_TOKEN_REFUSED == 77, out
    assert out.count(said) == 1, out  # once, not per batch
    assert f"the hub at {url}" in out
    assert "the agent needs a token with the 'ingest' scope" in out
    assert f"stays in the spool ({spool})" in out
    assert TOKEN not in out
    assert "Traceback" not in out
    assert RefusingHub.posts >= 1
    kept = Spool(spool, fsync=False)
    try:
        assert len(kept) >= 1  # the refused batch waits for a start with a token the hub accepts
    finally:
        kept.close()
