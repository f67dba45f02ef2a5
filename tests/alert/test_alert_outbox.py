"""The persisted outbox against a real loopback receiver: down for a minute, then back, loses nothing."""

from __future__ import annotations

import threading
from pathlib import Path

from alert.sink import Clock, Sink
from gpuscope.alert.notify.base import Request
from gpuscope.alert.outbox import Outbox
from gpuscope.alert.statedb import StateDB
from gpuscope.counters import Counters


def test_a_receiver_down_for_a_minute_gets_every_notification_in_order_when_back(
    sink: Sink, clock: Clock
) -> None:
    counters = Counters()
    outbox = Outbox(StateDB(), counters=counters, clock=clock, base_backoff=1.0, max_backoff=8.0)
    outbox.enqueue("hook", "webhook", [Request(f"{sink.url}/hook", {"n": 0})])
    assert outbox.deliver_due() is None and sink.wait_for(1) == [{"n": 0}]
    sink.down()
    for n in range(1, 6):
        outbox.enqueue("hook", "webhook", [Request(f"{sink.url}/hook", {"n": n})])
    start = clock.t
    while clock.t - start < 60:  # the receiver is down for a minute; the sender keeps trying
        outbox.deliver_due()
        clock.t += 0.5
    assert outbox.stats() == {"delivered": 1, "dead": 0, "pending": 5}
    head = outbox.pending()[0]
    assert head.attempts >= 6 and head.next_attempt_at - clock.t <= 8.0  # backed off, capped
    sink.up()
    while outbox.stats()["pending"]:
        outbox.deliver_due()
        clock.t += 0.5
        assert clock.t - start < 80, "not delivered within the capped backoff after the receiver came back"
    assert [b["n"] for b in sink.wait_for(6)] == [0, 1, 2, 3, 4, 5]
    assert counters.get("notifications_delivered") == 6 and counters.get("notification_retries") >= 6


def test_queued_notifications_survive_a_restart(tmp_path: Path, sink: Sink, clock: Clock) -> None:
    path = str(tmp_path / "alerts.sqlite")
    sink.down()
    outbox = Outbox(StateDB(path), clock=clock)
    outbox.enqueue("hook", "webhook", [Request(sink.url, {"n": 1}), Request(sink.url, {"n": 2})])
    outbox.deliver_due()
    outbox.db.close()  # the hub dies with two undelivered requests
    sink.up()
    again = Outbox(StateDB(path), clock=clock)
    clock.t += 60
    again.deliver_due()
    assert sink.wait_for(2) == [{"n": 1}, {"n": 2}] and again.stats()["pending"] == 0


def test_a_request_the_receiver_refuses_is_dead_and_does_not_block_the_next(clock: Clock) -> None:
    refusing = Sink(status=400)
    try:
        counters = Counters()
        outbox = Outbox(StateDB(), counters=counters, clock=clock)
        outbox.enqueue("hook", "webhook", [Request(refusing.url, {"bad": True})])
        outbox.deliver_due()
        assert outbox.stats() == {"delivered": 0, "dead": 1, "pending": 0}
        assert counters.get("notifications_dead") == 1
    finally:
        refusing.down()


def test_a_slow_error_is_retried_and_too_old_requests_are_given_up(clock: Clock) -> None:
    failing = Sink(status=503)
    try:
        outbox = Outbox(StateDB(), clock=clock, max_age=30.0)
        outbox.enqueue("hook", "webhook", [Request(failing.url, {"n": 1})])
        outbox.deliver_due()
        assert outbox.stats()["pending"] == 1 and "HTTP 503" in str(
            outbox.db.query("SELECT last_error FROM outbox")[0][0]
        )
        clock.t += 31
        outbox.deliver_due()
        assert outbox.stats() == {"delivered": 0, "dead": 1, "pending": 0}
    finally:
        failing.down()


def test_the_background_sender_delivers_at_once(sink: Sink) -> None:
    outbox = Outbox(StateDB())
    outbox.start()
    try:
        outbox.enqueue("hook", "webhook", [Request(sink.url, {"n": 1})])
        assert sink.wait_for(1, timeout=5) == [{"n": 1}]
    finally:
        outbox.stop()


class HeldSender:
    """Records each send; the first one waits, mid-send, until the test lets it go."""

    def __init__(self) -> None:
        self.sent: list[Request] = []
        self.sending = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Request) -> int:
        self.sent.append(request)
        if len(self.sent) == 1:
            self.sending.set()
            assert self.release.wait(10), "the test never let the first send go"
        return 200


def test_two_concurrent_deliveries_tell_a_receiver_each_notification_once_in_order(clock: Clock) -> None:
    sender = HeldSender()
    outbox = Outbox(StateDB(), sender=sender, clock=clock)
    outbox.enqueue("hook", "webhook", [Request("http://hook", {"n": n}) for n in range(3)])
    outbox.enqueue("pager", "webhook", [Request("http://pager", {"n": 9})])
    background = threading.Thread(target=outbox.deliver_due)
    background.start()
    try:
        assert sender.sending.wait(10), "the first delivery never reached the receiver"
        held = sender.sent[0].url  # the receiver the first delivery is sending to now
        outbox.deliver_due()  # a second delivery while the first is mid-send
        # the held receiver is left to the first delivery; the other is not kept waiting for it
        assert {p.request.url for p in outbox.pending()} == {held}
        assert all(r.url != held for r in sender.sent[1:])  # nothing of the held one sent again
    finally:
        sender.release.set()
        background.join(10)
    assert not background.is_alive()
    told = [(r.url, r.body["n"]) for r in sender.sent]
    assert sorted(told) == [("http://hook", 0), ("http://hook", 1), ("http://hook", 2), ("http://pager", 9)]
    assert [n for url, n in told if url == "http://hook"] == [0, 1, 2]  # each once, in order
    assert outbox.stats() == {"delivered": 4, "dead": 0, "pending": 0}
