"""The sender against a fake hub: outages, lost replies, refusals, retries, ordering, headers."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.fakes import FakeClock, FakeHub
from gpuscope.agent.sender import _ENVELOPE, FRAME_RETRY_S, Backoff, Sender
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.ingest.frame import CONTENT_TYPE as FRAME_CONTENT_TYPE
from gpuscope.ingest.frame import encode_frame
from gpuscope.ingest.payload import encode_batch
from gpuscope.model import Batch, Frame


def batch(seq: int, ts: float = 0.0) -> Batch:
    frame = Frame(ts, ["node_load1", "node_cpu_percent"], [{"node": "n1"}], np.array([[0.5, float(seq)]]))
    return Batch(source="n1", frames=[frame], batch_id=f"n1:boot:{seq}")


def make_sender(tmp_path: Path, hub: FakeHub, clock: FakeClock, counters: Counters, **kw: object) -> Sender:
    spool = Spool(tmp_path / "spool", counters=counters, fsync=False)
    return Sender(
        "http://hub.test:7470/",
        spool=spool,
        transport=hub.transport,
        counters=counters,
        clock=clock,
        rng=random.Random(7),
        **kw,  # type: ignore[arg-type]
    )


def test_hub_down_30_seconds_then_back_delivers_every_batch_once_in_order(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    sent = []
    for second in range(120):
        hub.down = 20 <= second < 50  # 30 virtual seconds of outage
        b = batch(second, clock())
        sender.submit(encode_batch(b), b.sample_count)
        sent.append(b.batch_id)
        clock.sleep(1.0)
    assert hub.stored_ids == sent  # every batch, in the order it was collected
    assert hub.seen_ids == sent  # and each reached the hub exactly once
    assert counters.get("batches_sent") == 120
    assert counters.get("samples_sent") == 240
    # the outage, plus the rounds before the next attempt noticed the hub was back
    assert 30 <= counters.get("batches_spooled") <= 30 + Backoff().cap
    assert counters.get("batches_replayed") == counters.get("batches_spooled")
    assert counters.get("send_failures") >= 1
    assert len(sender.spool) == 0 and sender.hub_ok
    # while down, attempts were spaced by the backoff, not one per round
    assert len(hub.requests) < 120 + 10
    sender.close()


def test_lost_replies_are_retried_and_the_hub_keeps_one_copy(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    sent = []
    for second in range(40):
        if second in (5, 17):
            hub.lose_replies = 2
        b = batch(second, clock())
        sender.submit(encode_batch(b), b.sample_count)
        sent.append(b.batch_id)
        clock.sleep(1.0)
    assert hub.stored_ids == sent
    assert len(hub.seen_ids) == 40 + 4  # four deliveries were repeated after a lost answer
    assert counters.get("batches_sent") == 40
    sender.close()


def test_permanent_refusal_is_counted_logged_once_and_not_retried(
    tmp_path: Path, hub: FakeHub, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    bad = {"n1:boot:3", "n1:boot:4", "n1:boot:8"}
    hub.refuse = lambda b: (400, "unknown metric") if b.batch_id in bad else None
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    for second in range(10):
        b = batch(second, clock())
        sender.submit(encode_batch(b), b.sample_count)
        clock.sleep(1.0)
    assert hub.seen_ids == [f"n1:boot:{i}" for i in range(10)]  # none was sent twice
    assert hub.stored_ids == [f"n1:boot:{i}" for i in range(10) if f"n1:boot:{i}" not in bad]
    assert counters.get("batches_refused") == 3
    assert counters.get("batches_refused.400") == 3
    assert counters.get("send_failures") == 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "hub refused a batch, HTTP 400: frames[0].metrics[0]: unknown metric"
        " (not retried; counted as batches_refused)"
    ]
    sender.close()


def test_refusal_of_a_spooled_batch_moves_on_to_the_next(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.down = True
    for i in range(3):
        sender.submit(encode_batch(batch(i)), 2)
    hub.down = False
    hub.refuse = lambda b: (422, "no") if b.batch_id == "n1:boot:1" else None
    clock.sleep(60)
    assert sender.flush() == 2
    assert hub.stored_ids == ["n1:boot:0", "n1:boot:2"]
    assert counters.get("batches_refused") == 1 and len(sender.spool) == 0
    sender.close()


def test_5xx_is_retried_with_backoff_until_accepted(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.status = 503
    sender.submit(encode_batch(batch(0)), 2)
    assert hub.stored == [] and len(sender.spool) == 1
    for _ in range(3):
        clock.sleep(Backoff().cap)
        sender.flush()
    assert counters.get("send_failures") == 4
    hub.status = None
    clock.sleep(Backoff().cap)
    assert sender.flush() == 1
    assert hub.stored_ids == ["n1:boot:0"]
    assert counters.get("batches_refused") == 0
    sender.close()


def test_429_retry_after_is_honoured(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.status, hub.retry_after = 429, "45"
    sender.submit(encode_batch(batch(0)), 2)
    hub.status = None
    clock.sleep(44.0)
    assert sender.flush() == 0 and len(hub.requests) == 1  # still waiting as the hub asked
    clock.sleep(1.0)
    assert sender.flush() == 1
    sender.close()


def test_an_overloaded_hubs_retry_after_is_not_stretched_by_earlier_failures(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.down = True
    for _ in range(6):  # the exponential backoff has reached its cap
        sender.submit(encode_batch(batch(0)), 2)
        clock.sleep(Backoff().cap)
    hub.down = False
    hub.status, hub.retry_after = 503, "1"  # the hub sheds load and asks to come back in 1 s
    sender.flush()
    hub.status = None
    clock.sleep(1.0)
    assert sender.flush() == 6  # back when the hub asked, not after the capped backoff
    sender.close()


def test_new_batches_queue_behind_the_spool_while_backing_off(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.down = True
    sender.submit(encode_batch(batch(0)), 2)
    hub.down = False  # back, but the sender does not know until its next attempt is due
    sender.submit(encode_batch(batch(1)), 2)
    assert len(hub.requests) == 1 and len(sender.spool) == 2
    clock.sleep(Backoff().cap)
    sender.submit(encode_batch(batch(2)), 2)
    assert hub.stored_ids == ["n1:boot:0", "n1:boot:1", "n1:boot:2"]
    sender.close()


def test_flush_stops_at_the_deadline(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    hub.down = True
    for i in range(5):
        sender.submit(encode_batch(batch(i)), 2)
    hub.down = False
    clock.sleep(Backoff().cap)
    assert sender.flush(deadline=clock() - 1) == 0
    assert sender.flush(deadline=clock() + 1) == 5
    sender.close()


def test_headers_token_and_url(tmp_path: Path, hub: FakeHub, clock: FakeClock) -> None:
    sender = make_sender(tmp_path, hub, clock, Counters(), token="s3cret-token-0123456789")
    sender.submit(encode_batch(batch(0)), 2)
    (req,) = hub.requests
    assert str(req.url) == "http://hub.test:7470/api/v1/ingest"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["authorization"] == "Bearer s3cret-token-0123456789"
    sender.close()
    (tmp_path / "other").mkdir()
    anonymous = make_sender(tmp_path / "other", hub, clock, Counters())
    anonymous.submit(encode_batch(batch(1)), 2)
    assert "authorization" not in hub.requests[-1].headers
    anonymous.close()
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        Sender("hub:7470", spool=anonymous.spool)


def test_backoff_grows_jittered_and_capped() -> None:
    rng = random.Random(1)
    b = Backoff(initial=0.5, factor=2.0, cap=10.0, jitter=0.5)
    for failures, full in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (6, 10.0), (40, 10.0)]:
        delays = [b.delay(failures, rng) for _ in range(50)]
        assert all(full * 0.5 <= d <= full for d in delays)
        assert len(set(delays)) > 1


def test_frames_go_out_as_frames_and_json_spool_records_still_replay(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    # an agent from before frames spooled JSON bodies while the hub was away
    old = Spool(tmp_path / "spool", fsync=False)
    for seq in range(3):
        b = batch(seq, clock())
        old.append(_ENVELOPE.pack(b.sample_count) + encode_batch(b))
    old.close()
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    for seq in range(3, 6):
        b = batch(seq, clock())
        sender.submit(encode_frame(b), b.sample_count)
    assert hub.stored_ids == [f"n1:boot:{k}" for k in range(6)]
    types = [r.headers["content-type"] for r in hub.requests]
    assert types == ["application/json"] * 3 + [FRAME_CONTENT_TYPE] * 3
    assert counters.get("batches_sent") == 6 and counters.get("samples_sent") == 12
    assert hub.stored[4].frames[0].values.tolist() == [[0.5, 4.0]]


def test_a_hub_without_frames_gets_json_then_is_asked_again_later(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    hub.reads_frames = False
    counters = Counters()
    sender = make_sender(tmp_path, hub, clock, counters)
    for seq in range(4):
        b = batch(seq, clock())
        sender.submit(encode_frame(b), b.sample_count)
        clock.sleep(1.0)
    assert hub.stored_ids == [f"n1:boot:{k}" for k in range(4)]  # each once, none refused
    types = [r.headers["content-type"] for r in hub.requests]
    # one frame refused with 415, converted and sent again at once; then JSON without asking
    assert types == [FRAME_CONTENT_TYPE] + ["application/json"] * 4
    assert counters.get("frames_refused_by_hub") == 1 and counters.get("batches_refused") == 0
    assert not sender.sends_frames
    hub.reads_frames = True  # the hub was upgraded
    clock.sleep(FRAME_RETRY_S)
    b = batch(4, clock())
    sender.submit(encode_frame(b), b.sample_count)
    assert hub.requests[-1].headers["content-type"] == FRAME_CONTENT_TYPE
    assert hub.stored_ids[-1] == "n1:boot:4" and sender.sends_frames


def test_a_dead_hub_is_left_for_the_next_known_one_at_once_and_a_dead_cluster_backs_off(
    tmp_path: Path, hub: FakeHub, clock: FakeClock
) -> None:
    dead: set[str] = {"a.test"}
    attempts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.host)
        if request.url.host in dead:  # what a SIGKILLed cluster member's port answers
            raise httpx.ConnectError("connection refused", request=request)
        return hub.handler(request)

    counters = Counters()
    sender = Sender(
        "http://a.test:7470,http://b.test:7470",
        spool=Spool(tmp_path / "spool", counters=counters, fsync=False),
        transport=httpx.MockTransport(handler),
        counters=counters,
        clock=clock,
        rng=random.Random(7),
    )
    first = batch(0, clock())
    sender.submit(encode_batch(first), first.sample_count)
    # delivered in the same call, to b, with no backoff and nothing left in the spool
    assert hub.stored_ids == [first.batch_id] and len(sender.spool) == 0 and sender.hub_ok
    assert counters.get("hub_fallbacks") == 1 and counters.get("batches_spooled") == 0

    dead.add("b.test")  # every hub gone: each is tried once, then the sender backs off
    second = batch(1, clock())
    sender.submit(encode_batch(second), second.sample_count)
    assert len(sender.spool) == 1 and not sender.hub_ok
    assert attempts == ["a.test", "b.test", "b.test", "a.test"]
    sender.submit(encode_batch(batch(2, clock())), 0)  # within the backoff: no attempt
    assert len(attempts) == 4 and len(sender.spool) == 2
    sender.close()
