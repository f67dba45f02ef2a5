"""``gpuscope alerts`` and ``gpuscope incidents`` against a real hub server, through its HTTP API."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from alert.rig import Scripted, hot, lost
from alert.sink import Sink
from gpuscope.alert.service import AlertingService
from gpuscope.alert.settings import parse_alerting
from gpuscope.cli import main
from gpuscope.cli_alerts import dollars_per_hour
from gpuscope.detect.engine import DetectionEngine
from gpuscope.hub import Hub
from gpuscope.rules import spec
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.web.server import HubServer

TOKEN = "a-test-token-of-enough-length"


@pytest.fixture
def served(sink: Sink) -> Iterator[tuple[HubServer, Scripted]]:
    hub = Hub(DuckDBStore(":memory:", durable=False))
    script = Scripted()
    hub.detection = DetectionEngine([script])
    cfg = {"receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}]}
    service = AlertingService(hub, parse_alerting(cfg))
    server = HubServer(hub, "127.0.0.1", 0, tokens=[TOKEN], evaluate_interval=0.1, alerting=service)
    service.start()
    server.start()
    yield server, script
    server.stop()
    service.stop()


def wait_firing(url: str, n: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 10
    while True:
        alerts = httpx.get(f"{url}/api/v1/alerting/alerts").json()["alerts"]
        if len(alerts) >= n:
            return list(alerts)
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_list_ack_silence_and_incidents_from_the_command_line(
    served: tuple[HubServer, Scripted], sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    server, script = served
    script.findings = [lost(), hot(node="node-2")]
    alerts = wait_firing(server.url, 2)
    assert [a["rule"] for a in alerts] == ["gpu_lost", "gpu_thermal_throttle"]  # P1 first
    sink.wait_for(1)  # the webhook heard it live
    hub = ["--hub", server.url]

    assert main(["alerts", *hub, "list"]) == 0
    out = capsys.readouterr().out
    assert "firing alerts (2)" in out and "gpu_lost" in out and "node=node-1 gpu=3" in out
    gpu_lost = next(line for line in out.splitlines() if "gpu_lost" in line)
    # who must act, and the cost in cents (before: no owner column, and $0.75/h read as 1)
    assert f"│ {spec('gpu_lost').owner} " in gpu_lost
    cost = next(a["cost_per_hour"] for a in alerts if a["rule"] == "gpu_lost")
    assert f"│ {dollars_per_hour(float(cost))} " in gpu_lost  # type: ignore[arg-type]

    assert main(["alerts", *hub, "ack", "al-1", "--by", "alice"]) == 1  # writes need the token
    assert "HTTP 401" in capsys.readouterr().err
    assert main(["alerts", *hub, "--token", TOKEN, "ack", "al-1", "--by", "alice", "--comment", "on it"]) == 0
    assert "acknowledged al-1" in capsys.readouterr().out
    assert (
        main(["alerts", *hub, "--token", TOKEN, "silence", "node=node-2", "--for", "2h", "--comment", "fan"])
        == 0
    )
    assert capsys.readouterr().out.startswith("silence sil-")
    assert main(["alerts", *hub, "--json", "list"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    state = {a["rule"]: (a["ack"], a["muted"]) for a in doc["alerts"]}
    assert state["gpu_lost"][0]["by"] == "alice" and state["gpu_thermal_throttle"][1].startswith(
        "silenced by sil-"
    )

    assert main(["alerts", *hub, "silences"]) == 0
    listed = capsys.readouterr().out
    assert 'node="node-2"' in listed and "fan" in listed
    sid = httpx.get(f"{server.url}/api/v1/silences").json()["silences"][0]["id"]
    assert main(["alerts", *hub, "--token", TOKEN, "unsilence", sid]) == 0
    assert httpx.get(f"{server.url}/api/v1/silences").json()["silences"] == []

    assert main(["alerts", *hub, "history", "al-1"]) == 0
    history = capsys.readouterr().out
    assert "fired" in history and "acknowledged" in history and "notified_firing" in history

    assert main(["incidents", *hub]) == 0
    table = capsys.readouterr().out
    assert "gpu_lost on node=node-1 gpu=3" in table and "P1" in table
    assert main(["incidents", *hub, "--json"]) == 0
    incidents = orjson.loads(capsys.readouterr().out)["incidents"]
    assert [i["tier"] for i in incidents] == ["P1", "P2"]  # ranked by tier, then cost

    script.findings = []
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/api/v1/alerting/alerts").json()["alerts"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert main(["alerts", *hub, "list", "--all", "--rule", "gpu_lost"]) == 0
    assert "resolved" in capsys.readouterr().out


def test_bad_requests_are_refused_naming_the_field(served: tuple[HubServer, Scripted]) -> None:
    server, _ = served
    auth = {"authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{server.url}/api/v1/silences", json={"matchers": []}, headers=auth)
    assert r.status_code == 400 and "at least one matcher" in r.json()["error"]
    r = httpx.post(f"{server.url}/api/v1/silences", json={"matchers": ["node=~["]}, headers=auth)
    assert r.status_code == 400 and r.json()["field"] == "matchers"
    r = httpx.post(f"{server.url}/api/v1/alerts/al-404/ack", json={"by": "x"}, headers=auth)
    assert r.status_code == 404
    r = httpx.get(f"{server.url}/api/v1/alerts/al-404/history")
    assert r.status_code == 404 and r.json()["field"] == "id" and "al-404" in r.json()["error"]
    r = httpx.post(f"{server.url}/api/v1/alerts/al-1/ack", json={}, headers=auth)
    assert r.status_code == 400 and r.json()["field"] == "by"
    r = httpx.post(f"{server.url}/api/v1/alerts/al-1/ack", content=b"[", headers=auth)
    assert r.status_code == 400 and r.json()["field"] == "body"
    assert httpx.get(f"{server.url}/api/v1/alerting/alerts?state=x").status_code == 400
    assert httpx.get(f"{server.url}/api/v1/alerting/status").json()["receivers"] == ["hook"]


def test_a_cost_per_hour_below_ten_dollars_keeps_its_cents() -> None:
    assert [dollars_per_hour(x) for x in (0.0, 0.75, 2.5, 9.994, 60.0, 1234.4)] == [
        "0.00",
        "0.75",
        "2.50",
        "9.99",
        "60",
        "1,234",
    ]
