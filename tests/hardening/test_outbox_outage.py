"""A receiver down for an hour, on a virtual clock: the outbox keeps every notification through the
hour and through a hub restart, then delivers them all, in order, once each."""

from __future__ import annotations

from pathlib import Path

from alert.sink import Clock, Sink
from gpuscope.alert.notify.base import Request
from gpuscope.alert.outbox import Outbox
from gpuscope.alert.statedb import StateDB
from gpuscope.counters import Counters

HOUR = 3600.0


def test_receiver_down_for_an_hour_gets_everything_in_order_once(tmp_path: Path) -> None:
    path = str(tmp_path / "alerts.sqlite")
    clock = Clock()
    sink = Sink()
    sink.down()
    counters = Counters()
    outbox = Outbox(StateDB(path), counters=counters, clock=clock)
    start = clock.t
    sent = 0
    restarted = False
    try:
        while clock.t - start < HOUR:
            if (clock.t - start) % 300 == 0:  # an alert change every five minutes
                outbox.enqueue("hook", "webhook", [Request(f"{sink.url}/hook", {"n": sent})])
                sent += 1
            if not restarted and clock.t - start >= HOUR / 2:  # the hub restarts mid-outage
                outbox.db.close()
                outbox = Outbox(StateDB(path), counters=counters, clock=clock)
                restarted = True
            outbox.deliver_due()
            clock.t += 10
        assert outbox.stats() == {"delivered": 0, "dead": 0, "pending": sent}
        assert [p.request.body["n"] for p in outbox.pending()] == list(range(sent))
        assert counters.get("notification_retries") >= 100  # it kept trying, backed off and capped

        sink.up()
        while outbox.stats()["pending"]:
            outbox.deliver_due()
            clock.t += 1
            assert clock.t - start < HOUR + 60, "not delivered within the capped backoff"
        assert [b["n"] for b in sink.wait_for(sent)] == list(range(sent))
        outbox.deliver_due()
        clock.t += 120
        outbox.deliver_due()
        assert len(sink.bodies()) == sent  # nothing delivered twice
        assert outbox.stats() == {"delivered": sent, "dead": 0, "pending": 0}
    finally:
        outbox.db.close()
        sink.down()
