"""Our alerts pushed to a real Alertmanager (API v2), seen through its own API and its own webhook."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from alert.amproc import Alertmanager
from alert.rig import Rig, lost
from alert.sink import Clock, Sink

pytestmark = pytest.mark.integration


def test_alertmanager_receives_our_alerts_shows_them_and_resolves_them(tmp_path: Path, sink: Sink) -> None:
    am = Alertmanager(tmp_path, f"{sink.url}/from-am")
    clock = Clock(time.time())  # Alertmanager judges endsAt against its own clock
    rig = Rig({"receivers": [{"name": "am", "alertmanager": {"url": am.url}}]}, clock)
    try:
        rig.step(0.5, [lost("3"), lost("4")])
        shown = am.alerts()
        assert sorted(str(a["labels"]["gpu"]) for a in shown) == ["3", "4"]  # type: ignore[index]
        first = shown[0]
        assert first["labels"]["alertname"] == "gpu_lost" and first["labels"]["severity"] == "P1"  # type: ignore[index]
        assert first["status"]["state"] == "active" and "summary" in first["annotations"]  # type: ignore[index, operator]
        # Alertmanager's own notification path got them too (its webhook, version 4).
        deadline = time.monotonic() + 15
        while len({a["labels"]["gpu"] for b in sink.bodies("/from-am") for a in b["alerts"]}) < 2:
            assert time.monotonic() < deadline, "Alertmanager did not notify its webhook"
            time.sleep(0.1)
        assert all(b["version"] == "4" for b in sink.bodies("/from-am"))
        # GPU 4 comes back: Alertmanager shows it resolved (gone from the active list) and says so.
        while time.time() < clock.t + 0.5:  # our clock must not run ahead of Alertmanager's
            time.sleep(0.05)
        clock.t = time.time() - 0.2
        rig.step(0.1, [lost("3")])
        assert [a["labels"]["gpu"] for a in am.alerts(active="true")] == ["3"]  # type: ignore[index]
        deadline = time.monotonic() + 15
        while not any(b["status"] == "resolved" for b in sink.bodies("/from-am")):
            assert time.monotonic() < deadline, "Alertmanager did not send the resolved notification"
            time.sleep(0.1)
        # While firing we re-send (Alertmanager expects it); after the resend interval the push repeats.
        pushes = rig.hub.counters.get("notifications_delivered")
        rig.service.tick(clock.t + 61)
        rig.service.outbox.deliver_due(clock.t + 61)
        assert rig.hub.counters.get("notifications_delivered") == pushes + 1
        assert [a["labels"]["gpu"] for a in am.alerts(active="true")] == ["3"]  # type: ignore[index]
    finally:
        rig.close()
        am.close()
