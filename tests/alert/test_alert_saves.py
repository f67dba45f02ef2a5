"""An evaluation's alert transitions reach the store in one write, before anyone hears of them;
the triage worker's later save of an alert (its playbook) lands after that write and is what stays,
the playbooks of one pass of the worker in one write."""

from __future__ import annotations

import threading

from alert.rig import Rig, lost
from alert.sink import Clock, Sink
from gpuscope.alert.engine import AlertChange
from gpuscope.model import Alert

N = 40


def writes(rig: Rig) -> int:
    return rig.store.counters.get("store.alert_writes")


def stored(rig: Rig) -> dict[str, list[Alert]]:
    """The store's alerts by id (a list, so that a row stored twice would show)."""
    out: dict[str, list[Alert]] = {}
    for alert in rig.store.alerts(limit=10 * N):
        out.setdefault(alert.id, []).append(alert)
    return out


def test_an_evaluation_firing_many_alerts_saves_them_in_one_store_write_before_telling_anyone(
    sink: Sink, clock: Clock
) -> None:
    rig = Rig({"receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}]}, clock)
    heard_stored: list[bool] = []

    def listener(change: AlertChange) -> None:  # runs before the triage queue hears the change
        heard_stored.append(change.alert.id in {a.id for a in rig.store.alerts(limit=10 * N)})

    rig.hub.add_listener(listener)
    try:
        before = writes(rig)
        rig.script.findings = [lost("0", f"node-{i}") for i in range(N)]
        fired = rig.hub.evaluate(clock.t)
        assert len(fired) == N and writes(rig) == before + 1
        assert heard_stored == [True] * N
        assert all(alert[0].firing and "playbook" not in alert[0].details for alert in stored(rig).values())

        before = writes(rig)
        assert rig.service.drain(10.0)  # triage: each alert saved again, with its playbook
        assert writes(rig) == before + 1  # one pass of the worker: its playbooks in one write
        saved = stored(rig)
        assert sorted(saved) == sorted(c.alert.id for c in fired)
        assert all(len(copies) == 1 and "playbook" in copies[0].details for copies in saved.values())

        before = writes(rig)
        rig.step(1, [])  # every one resolves in one evaluation: one write again
        assert writes(rig) == before + 1
        saved = stored(rig)
        assert len(saved) == N
        assert all(
            len(c) == 1 and c[0].resolved_at == clock.t and "playbook" in c[0].details for c in saved.values()
        )
    finally:
        rig.close()


def test_an_evaluation_that_fails_half_way_still_saves_what_it_fired(sink: Sink, clock: Clock) -> None:
    rig = Rig({"receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}]}, clock)
    try:
        good = [lost("0", f"node-{i}") for i in range(3)]
        bad = lost("0", "node-9")
        bad.rule = "no_such_rule"
        rig.script.findings = [*good, bad]
        try:
            rig.hub.evaluate(clock.t)
        except ValueError as exc:
            assert "no_such_rule" in str(exc)
        else:
            raise AssertionError("a finding of an unknown rule must be refused")
        assert len(rig.hub.alerts.firing()) == 3
        assert {a.entity["node"] for a in rig.store.alerts(firing_only=True)} == {
            "node-0",
            "node-1",
            "node-2",
        }
    finally:
        rig.close()


def test_a_save_from_another_thread_during_an_evaluation_is_not_held_for_its_write(clock: Clock) -> None:
    rig = Rig({"receivers": [{"name": "hook", "webhook": {"url": "http://127.0.0.1:9/hook"}}]}, clock)
    other = Alert("al-99", "gpu_lost", "P1", "infra", {"node": "node-x", "gpu": "0"}, 1.0, "lost", 1.0)
    seen: list[bool] = []
    try:
        with rig.hub.alerts.state.batch():  # as an evaluation holds it
            thread = threading.Thread(target=rig.hub.save_alert, args=(other,))  # an acknowledgement's save
            thread.start()
            thread.join(10)
            seen.append(other.id in {a.id for a in rig.store.alerts()})
        assert seen == [True]
    finally:
        rig.close()


def test_acknowledging_an_incident_saves_its_alerts_in_one_store_write(sink: Sink, clock: Clock) -> None:
    rig = Rig({"receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}]}, clock)
    try:
        rig.step(0, [lost(str(g), "node-1") for g in range(4)])  # one node's GPUs: one incident
        (incident,) = rig.hub.alerts.incidents()
        before = writes(rig)
        assert len(rig.service.ack(incident.id, "alice")) == 4
        assert writes(rig) == before + 1
        assert all(a.details["ack"]["by"] == "alice" for a in rig.store.alerts(firing_only=True))
    finally:
        rig.close()
