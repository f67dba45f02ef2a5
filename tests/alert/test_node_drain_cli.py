"""``gpuscope node drain NODE --for 2h --reason ...``: token-authorised, mutes the node's alerts
(a silence on node=NODE for as long) and counts its GPU time as maintenance."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import AlertingSettings
from gpuscope.cli import main
from gpuscope.model import Batch, Frame
from gpuscope.web.server import HubServer
from hubserve import memory_hub, serve_hub

TOKEN = "a-test-token-of-enough-length"


@pytest.fixture
def served() -> Iterator[HubServer]:
    hub = memory_hub()
    alerting = AlertingService(hub, AlertingSettings())
    with serve_hub(hub, tokens=[TOKEN], alerting=alerting, evaluate_interval=None) as server:
        yield server


def test_drain_from_the_command_line_mutes_alerts_and_counts_maintenance(
    served: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = served.hub
    base = ["--hub", served.url]
    assert main(["node", "drain", "node-1", "--for", "2h", "--reason", "firmware", *base]) == 1  # no token
    assert "401" in capsys.readouterr().err
    args = ["node", "drain", "node-1", "--for", "2h", "--reason", "firmware", *base, "--token", TOKEN]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "node-1" and doc["reason"] == "firmware"
    assert doc["until"] == pytest.approx(time.time() + 7200, abs=30)
    alerting = served.api.alerting
    assert alerting is not None
    silence = next(s for s in alerting.silences.list(time.time()) if s.id == doc["silence"])
    assert silence.mutes({"node": "node-1", "gpu": "3"}, time.time())
    assert not silence.mutes({"node": "node-2"}, time.time())
    now = time.time()
    for k in range(10):
        entities = [{"node": "node-1", "gpu": str(g)} for g in range(2)]
        hub.ingest(
            Batch("node-1", frames=[Frame(now + k, ["gpu_utilization_percent"], entities, np.zeros((2, 1)))])
        )
        hub.evaluate(now + k)
    assert {g["state"] for g in hub.productivity.gpu_states()} == {"maintenance"}
    assert main(["node", "drains", *base, "--token", TOKEN]) == 0
    assert "node-1 until" in capsys.readouterr().out
    assert main(["node", "undrain", "node-1", *base, "--token", TOKEN]) == 0
    assert hub.productivity.active_drains() == []
    ended = next(s for s in alerting.silences.list(time.time(), True) if s.id == doc["silence"])
    assert not ended.active(time.time())  # the drain's silence ended with it
