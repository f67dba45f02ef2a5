"""Admission of ingest requests: the hub sheds while behind and says so once per episode."""

from __future__ import annotations

import math
import random

import pytest

from gpuscope.ingest.delay import MAX_HELD, HubDelay
from gpuscope.ingest.overload import OverloadMonitor, OverloadSettings, SenderKey, node_sender
from gpuscope.rules import HUB_OVERLOADED


def monitor(**kw: float) -> OverloadMonitor:
    return OverloadMonitor(OverloadSettings(**kw), name="hub-a", rng=random.Random(3))  # type: ignore[arg-type]


def test_requests_past_the_in_flight_limit_are_shed_with_a_spread_retry_after() -> None:
    m = monitor(max_in_flight=2, retry_after_s=2.0)
    first, second = m.admit(0.0), m.admit(0.0)
    assert first.ticket is not None and second.ticket is not None
    refusals = [m.admit(0.1) for _ in range(50)]
    assert all(r.ticket is None for r in refusals)
    assert {r.retry_after for r in refusals} <= {2, 3, 4} and len({r.retry_after for r in refusals}) > 1
    assert m.shed == 50 and m.behind(0.1)
    m.done(first.ticket)
    m.done(second.ticket)
    assert m.admit(0.2).ticket is not None  # room again: admitted, though still settling


def test_a_request_waiting_past_the_lag_budget_makes_the_hub_behind() -> None:
    m = monitor(max_lag_s=2.0)
    slow = m.admit(0.0)
    assert slow.ticket is not None and not m.behind(1.9)
    assert m.behind(2.1) and m.admit(2.1).ticket is None
    m.done(slow.ticket)
    assert m.admit(2.2).ticket is not None


def test_behind_lasts_until_settled_and_raises_one_finding_per_episode() -> None:
    m = monitor(max_in_flight=1, retry_after_s=1.0)  # settles 2 x 1 + 2 = 4 s after the last sign
    ticket = m.admit(0.0).ticket
    assert ticket is not None
    assert m.admit(1.0).ticket is None
    m.done(ticket)
    findings = m.findings(3.0)
    assert [f.rule for f in findings] == [HUB_OVERLOADED]
    assert findings[0].entity == {"hub": "hub-a"} and findings[0].affected_gpus == 0
    assert findings[0].details["since_ts"] == 1.0
    assert m.behind(4.9) and not m.behind(5.0)
    assert m.episodes == 1
    m.evaluated(10.0, 6.0)  # the evaluation loop ran 6 s late: a second episode
    assert m.behind(10.0) and m.episodes == 2


def test_the_alert_outlasts_an_episode_so_a_hub_that_keeps_falling_behind_is_one_alert() -> None:
    m = monitor(max_in_flight=1, retry_after_s=1.0, alert_hold_s=60.0)  # settles 4 s after the last sign
    ticket = m.admit(0.0).ticket
    assert ticket is not None and m.admit(1.0).ticket is None
    m.done(ticket)
    assert [f.rule for f in m.findings(2.0)] == [HUB_OVERLOADED]
    assert not m.behind(5.0)
    later = m.admit(5.0).ticket
    assert later is not None  # shedding has stopped ...
    m.done(later)
    (held,) = m.findings(30.0)  # ... the alert has not: no resolve and re-fire per episode
    assert held.details["since_ts"] == 1.0 and held.details["behind_now"] is False
    assert "caught up" in held.summary
    m.evaluated(40.0, 6.0)  # a second episode inside the hold: the same alert, same start
    (again,) = m.findings(40.0)
    assert again.details["since_ts"] == 1.0 and m.episodes == 2
    m.evaluated(41.0, 0.0)
    assert m.findings(99.0) != [] and m.findings(100.0) == []  # 60 s after the last sign (40 s)
    m.evaluated(200.0, 6.0)  # a new episode long after: a new alert
    (fresh,) = m.findings(200.0)
    assert fresh.details["since_ts"] == 200.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_lag_s", 0.0),
        ("retry_after_s", float("nan")),
        ("max_in_flight", 0),
        ("settle_s", -1.0),
        ("alert_hold_s", float("inf")),
    ],
)
def test_bad_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        OverloadSettings(**{field: value})  # type: ignore[arg-type]


def test_an_event_loop_running_timers_late_makes_the_hub_behind() -> None:
    m = monitor(max_loop_lag_s=2.0, retry_after_s=1.0)
    m.loop_lag(0.0, 0.3)
    assert not m.behind(0.0)
    m.loop_lag(1.0, 2.5)  # starved of CPU: requests wait for the loop before they are admitted
    assert m.behind(1.0) and m.admit(1.0).ticket is None
    m.loop_lag(1.5, 0.1)
    ticket = m.admit(1.5).ticket
    assert ticket is not None
    m.done(ticket)
    assert m.behind(4.9) and not m.behind(5.0)
    assert m.status(5.0)["event_loop_probes"] == 3


def test_the_cover_names_each_refused_sender_with_the_end_of_its_gap_and_the_delay_imposed() -> None:
    m = monitor(max_in_flight=1, retry_after_s=2.0)  # settle: 2 x 2 + 2 = 6 s
    held = m.admit(0.0)
    assert held.ticket is not None
    assert m.admit(1.0, (("node", "n1"),)).ticket is None
    cover = m.cover(1.0)
    assert cover.refused == {(("node", "n1"),): 7.0} and cover.everyone_until == -math.inf
    assert cover.delay == 1.0  # the request in flight has waited 1 s
    assert m.admit(2.0).ticket is None  # a sender that names nobody: every sender's gap
    assert m.cover(2.0).everyone_until == 8.0
    m.done(held.ticket)
    back = m.admit(3.0, (("node", "n1"),))
    assert back.ticket is not None  # room again: n1 is back
    m.done(back.ticket)
    # the oldest request's wait of 2 s, seen at 2.0, is in force for settle, its own length and a
    # reporting interval after: the news it held back comes in once the hub has caught up
    assert m.cover(10.9).delay == 2.0 and m.cover(11.0).delay == 0.0
    m.loop_lag(12.0, 3.0)
    assert m.cover(13.0).delay == 3.0 and m.cover(21.9).delay == 3.0 and m.cover(22.0).delay == 0.0
    assert m.cover(606.9).refused and m.cover(607.0).refused == {}  # remembered for 600 s past its end


def test_late_news_is_the_hubs_delay_only_while_behind_and_not_one_senders_own_lateness() -> None:
    """Each sender's clock is skewed its own way (learned as its usual offset); a sender late on its
    own side (flushing its spool) is not the hub's delay; nearly all late while the hub is behind is."""
    m = monitor()
    skew = {"a": -30.0, "b": 0.0, "c": 7.5, **{f"n{i}": 0.0 for i in range(8)}}  # sender minus hub clock
    for t in range(10):
        m.arrived(float(t), [(s, t + k) for s, k in skew.items()])
    assert m.cover(9.0).delay == 0.0
    m.arrived(10.0, [("a", 10 - 30.0 - 40), *[(s, 10 + k) for s, k in skew.items() if s != "a"]])  # a's spool
    assert m.status(10.0)["arrival_lag_seconds"] == 0.0 and m.cover(10.0).delay == 0.0
    m.arrived(11.0, [(s, 11 + k - 1) for s, k in skew.items()])  # everyone 1 s late: the hub's tick
    assert m.cover(11.0).delay == 0.0
    # everyone 6 s late, though nothing else says the hub is behind: their news queued on its way
    # in (a connection pool); counted while seen, not for its own length (senders flushing spools
    # after a partition are as late)
    m.arrived(12.0, [(s, 12 + k - 6) for s, k in skew.items()])
    assert m.cover(12.0).delay == pytest.approx(6.0, abs=0.1) and not m.behind(12.0)
    settle = m.settings.settle
    assert m.cover(12.0 + settle + 0.9).delay > 5.9 and m.cover(12.0 + settle + 1).delay == 0.0
    m.loop_lag(20.0, 3.0)  # behind now: late news is the hub's delay for its own length after
    m.arrived(20.0, [(s, 20 + k - 9) for s, k in skew.items()])
    assert m.cover(20.0).delay == pytest.approx(9.0, abs=0.1)
    end = 20.0 + settle + m.cover(20.0).delay + 1
    assert m.cover(end - 0.1).delay > 8.9 and m.cover(end).delay == 0.0


def test_an_event_loop_blocked_now_is_seen_while_it_is_blocked() -> None:
    """The loop's timer reports its lag only once it runs again; until then the hub knows it is
    overdue: it is behind, and the silences it causes meanwhile are its delay."""
    m = monitor(max_loop_lag_s=2.0)
    m.loop_lag(10.0, 0.0, next_due=10.25)
    assert not m.behind(11.0) and m.cover(11.0).delay == pytest.approx(0.75)
    assert m.behind(20.0) and m.cover(20.0).delay == pytest.approx(9.75)
    assert m.admit(20.0).ticket is None


def test_late_news_counts_while_the_senders_queues_drain_after_the_hub_caught_up() -> None:
    m = monitor()
    senders = [f"n{i}" for i in range(10)]
    for t in range(10):
        m.arrived(float(t), [(s, float(t)) for s in senders])
    m.loop_lag(10.0, 3.0)  # the last sign of lag; settled by 10 + settle
    late_at = 10.0 + m.settings.settle + 5
    m.arrived(late_at, [(s, late_at - 12) for s in senders])  # still draining, 12 s late
    assert m.cover(late_at).delay == pytest.approx(12.0, abs=0.1)
    assert m.cover(late_at + m.settings.settle + 11.8).delay == pytest.approx(12.0, abs=0.1)
    m.arrived(100.0, [(s, 100 - 12.0) for s in senders])  # long after: in force only while seen
    assert m.cover(100.0).delay == pytest.approx(12.0, abs=0.2)
    assert m.cover(100.0 + m.settings.settle + 1).delay == 0.0


def test_the_delays_in_force_stay_bounded_however_many_readings_come() -> None:
    """Each reading is in force for its own length: a long, slowly falling backlog leaves many
    in force at once; they are kept bounded and the longest always wins."""
    delay = HubDelay(settle=6.0)
    for i in range(2000):  # falling slower than time passes: each outlasts the ones before
        delay.waiting(i * 0.5, 1000.0 - i * 0.4)
    assert len(delay) <= MAX_HELD
    # reading i (1000 - 0.4 i at 0.5 i) is in force until 1007 + 0.1 i: never less than the truth
    assert delay.delay(1000.0) == 1000.0
    assert 1000 - 0.4 * 931 <= delay.delay(1100.0) <= 1000 - 0.4 * 931 + 20
    assert delay.delay(1007 + 0.1 * 1999 + 0.01) == 0.0


def test_a_late_evaluation_holds_verdicts_only_until_the_next_one_has_seen_what_waited() -> None:
    m = monitor()
    m.evaluated(100.0, 60.0)  # a 60-s stall: the requests taken meanwhile are all seen now
    settle = m.settings.settle
    assert m.cover(100.0).delay == 60.0 and m.cover(100.0 + settle + 0.9).delay == 60.0
    assert m.cover(100.0 + settle + 1).delay == 0.0


def _key(node: str) -> SenderKey:
    return node_sender(node)


def test_senders_served_in_turn_by_their_own_pool_are_not_dead_on_the_wire_and_one_that_stopped_is() -> None:
    """20 senders whose requests reach the hub one every 0.6 s, in turn (their connection pool is
    starved): each knocks every 12 s, longer than threshold plus settle (4 + 6 s). The turn is the
    fleet's, so none is dead; node-19, which stopped at 60, is, once silent for threshold + turn."""
    m = monitor()
    names = [f"node-{i}" for i in range(20)]
    dead_at: float | None = None
    for step in range(300):
        t = step * 0.6
        name = names[step % 20]
        if name != "node-19" or t < 60:
            ticket = m.admit(t, _key(name)).ticket
            if ticket is not None:
                m.done(ticket)
        wire = m.cover(t).wire
        alive = [n for n in names if not wire.dead(_key(n), 4.0)]
        assert alive[:19] == names[:19], t  # never a live one
        if dead_at is None and "node-19" not in alive:
            dead_at = t
    last = 59.4  # node-19's last knock (t = 0.6 k with k % 20 == 19)
    assert dead_at is not None and last + 4 + 11 <= dead_at <= last + 4 + 12 / 0.9 + 1


def test_a_request_in_flight_is_a_knock_and_a_hub_that_reads_no_headers_blames_nobody() -> None:
    m = monitor()
    for name in ("node-1", "node-2"):
        ticket = m.admit(0.0, _key(name)).ticket
        assert ticket is not None
        m.done(ticket)
    assert m.admit(1.0, _key("node-0")).ticket is not None  # its request waits on the hub
    wire = m.cover(30.0).wire  # no header read since 1 s (a starved event loop): no one's silence grew
    assert wire.silence(_key("node-0")) == 0.0 and wire.silence(_key("node-1")) == 1.0
    assert not any(wire.dead(_key(n), 4.0) for n in ("node-0", "node-1", "node-2"))
    assert wire.silence(_key("node-7")) is None  # never named: judged by its data alone


def test_knocks_on_ingest_workers_reach_the_hubs_wire_so_a_sender_silent_on_every_process_is_dead() -> None:
    """With ``hub.ingest_workers`` the requests reach worker processes, not the hub's own monitor:
    each worker reports who knocked since its last report, and the hub's wire takes the latest
    knock of each sender over all of them. 20 nodes, each alternating between two workers;
    node-19 stops at 20 s on every process."""
    workers, hub = [monitor(), monitor()], monitor()
    names = [f"node-{i}" for i in range(20)]
    for step in range(60):
        t = float(step)
        for i, name in enumerate(names):
            if name == "node-19" and t >= 20:
                continue
            ticket = workers[(i + step) % 2].admit(t, _key(name)).ticket
            if ticket is not None:
                workers[(i + step) % 2].done(ticket)
        for index, worker in enumerate(workers):
            hub.worker_report(t, index, {}, -math.inf, 0, False, worker.take_knocks())
    wire = hub.cover(59.0).wire
    assert [wire.silence(_key(n)) for n in names[:19]] == [0.0] * 19
    assert not any(wire.dead(_key(n), 4.0) for n in names[:19])
    assert wire.silence(_key("node-19")) == 40.0 and wire.dead(_key("node-19"), 4.0)
