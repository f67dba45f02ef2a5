"""An evaluation that lands while the alerting clock flushes a group (issue 13 (c): a receiver was
told one resolution twice, in one notification, in the failover test under load).

The evaluator thread resolves an alert (it sets ``resolved_at``) while the clock thread is inside
a group's flush, between the group's "what fires" and "what resolved" passes. The interleaving is
injected: the flush asks the flap detector about each firing alert, and here that question runs
the evaluation that resolves it, as the evaluator thread would at that moment. A receiver must be
told the alert fires, then that it resolved: each once, in that order, whenever the evaluation
lands."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from alert.rig import Rig, lost
from alert.sink import Clock, Sink
from gpuscope.model import Alert


def _cfg(sink: Sink) -> dict[str, object]:
    return {
        "receivers": [{"name": "hook", "webhook": {"url": f"{sink.url}/hook"}}],
        "routes": [{"receiver": "hook", "group_wait": "0s", "group_interval": "1s"}],
    }


@pytest.fixture
def rig(sink: Sink, clock: Clock) -> Iterator[Rig]:
    made = Rig(_cfg(sink), clock)
    yield made
    made.close()


def _told(sink: Sink) -> list[tuple[str, str]]:
    """(fingerprint, status) of every alert in every notification, in arrival order."""
    return [(a["fingerprint"], a["status"]) for body in sink.bodies("/hook") for a in body["alerts"]]


def _evaluate_inside_next_flush(rig: Rig) -> list[float]:
    """The next time the dispatcher asks whether a firing alert flaps (inside a group's flush),
    the hub evaluates at the rig's clock first, as the evaluator thread may at that moment.
    Returns the times it did so (once)."""
    flap = rig.service.dispatcher.flap
    asked: Callable[[Alert, float], bool] = flap.flapping
    ran: list[float] = []

    def flapping(alert: Alert, now: float) -> bool:
        if not ran:
            ran.append(rig.clock.t)
            rig.hub.evaluate(rig.clock.t)
        return asked(alert, now)

    flap.flapping = flapping  # type: ignore[method-assign]
    return ran


def _deliver(rig: Rig) -> None:
    assert rig.service.drain(10.0)
    rig.service.tick()
    rig.service.outbox.deliver_due()


def test_a_resolution_evaluated_during_the_clocks_flush_is_told_once(
    rig: Rig, sink: Sink, clock: Clock
) -> None:
    rig.step(1, [lost()])
    sink.wait_for(1)
    (fp, status), *_ = _told(sink)
    assert status == "firing"
    rig.script.findings = []  # the GPU is back; the next evaluation resolves the alert
    clock.t += 5  # past group_interval: the group's next change goes out at the next flush
    ran = _evaluate_inside_next_flush(rig)
    rig.service.tick()  # the clock's flush, with the evaluation landing inside it
    assert ran, "the injected evaluation did not run inside the flush"
    rig.service.outbox.deliver_due()
    _deliver(rig)  # the resolution's own dispatch, then the clock again
    clock.t += 2
    _deliver(rig)
    sink.wait_for(2)
    assert _told(sink) == [(fp, "firing"), (fp, "resolved")], sink.bodies("/hook")
    assert [a.resolved_at for a in rig.hub.alert_view()[0]] == [clock.t - 2]


def test_an_alert_resolved_while_its_first_notification_is_built_is_told_firing_then_resolved(
    rig: Rig, sink: Sink, clock: Clock
) -> None:
    rig.script.findings = [lost()]
    clock.t += 1
    rig.hub.evaluate(clock.t)  # fires; its dispatch waits in the triage queue
    rig.script.findings = []
    clock.t += 1
    ran = _evaluate_inside_next_flush(rig)
    _deliver(rig)  # the fired alert's flush, with the resolving evaluation landing inside it
    assert ran, "the injected evaluation did not run inside the flush"
    clock.t += 2
    _deliver(rig)
    sink.wait_for(2)
    told = _told(sink)
    assert [status for _, status in told] == ["firing", "resolved"], told
    assert told[0][0] == told[1][0]
