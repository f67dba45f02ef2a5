"""The binary frame: the same batch as the JSON path, refusals that name the field and offset."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson
import pytest

import gpuscope.ingest.frame as frame_module
from gpuscope.agent.agent import Agent
from gpuscope.collect.fake_nvml import SW_POWER, FakeNvml
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.ingest.frame import (
    CONTENT_TYPE,
    decode_body,
    decode_frame,
    encode_frame,
    encode_parts,
    frame_to_json,
    head,
    is_frame,
)
from gpuscope.ingest.payload import (
    Limits,
    PayloadError,
    batch_to_json,
    decode_json,
    encode_batch,
    parse_batch,
)
from gpuscope.model import MAX_TIMESTAMP, Batch, Event, Frame, TrainingRecord


def agent_batches(tmp_path: Path, rounds: int = 3) -> list[Batch]:
    """What a real agent collects: the NVML collector over the fake NVML (a throttled GPU, a lost
    one that reports nothing), plus the agent's own start event."""
    fake = FakeNvml.healthy(8)
    fake.throttle(5, SW_POWER)
    fake.gpus[3].temp = 71
    agent = Agent(
        "http://hub.test",
        "node-9",
        [NvmlCollector("node-9", lib=fake, slow_every=1, watch_events=False)],
        spool_dir=tmp_path / "spool",
        fsync=False,
    )
    try:
        out = []
        for k in range(rounds):
            if k == 1:
                fake.lose(6)
            out.append(agent.run_once(1_700_000_000.0 + k))
        return out
    finally:
        agent.close()


def same(a: Batch, b: Batch) -> None:
    assert (a.source, a.batch_id, a.events, a.training) == (b.source, b.batch_id, b.events, b.training)
    assert len(a.frames) == len(b.frames)
    for f, g in zip(a.frames, b.frames, strict=True):
        assert (f.ts, f.metrics, f.entities) == (g.ts, g.metrics, g.entities)
        np.testing.assert_array_equal(f.values, g.values)  # NaN (not reported) in the same cells


def test_agent_batches_decode_to_the_same_batch_as_their_json(tmp_path: Path) -> None:
    batches = agent_batches(tmp_path)
    assert batches[0].events[0].kind == "agent_started"
    assert len(batches[0].frames[0].entities) == 8 and batches[0].frames[0].metrics
    for b in batches:
        via_json = parse_batch(decode_json(encode_batch(b)))
        via_frame = decode_body(CONTENT_TYPE, encode_frame(b))
        same(via_frame, via_json)
        assert sum(f.sample_count for f in via_frame.frames) == b.sample_count
        same(decode_body("application/json", frame_to_json(encode_frame(b))), via_json)


def test_training_and_events_ride_in_the_frame() -> None:
    b = Batch(
        "sdk:llm",
        events=[Event(5.0, "heartbeat", {"job": "llm", "rank": "3"}, {"step": 7})],
        training=[
            TrainingRecord(5.0, "llm", 3, 7, {"loss": float("nan"), "step_seconds": 1.2}, {"node": "n"})
        ],
        batch_id="sdk:llm:1",
    )
    got = decode_frame(encode_frame(b))
    assert batch_to_json(got) == batch_to_json(parse_batch(decode_json(encode_batch(b))))
    assert is_frame(encode_frame(b)) and not is_frame(encode_batch(b))


def good() -> Batch:
    frame = Frame(
        10.0, ["gpu_temp_celsius", "gpu_power_watts"], [{"node": "n", "gpu": "0"}], np.array([[60.0, np.nan]])
    )
    return Batch("n", [frame], batch_id="n:1")


def patched(body: bytes, at: int, raw: bytes) -> bytes:
    return body[:at] + raw + body[at + len(raw) :]


def refusal(body: bytes) -> PayloadError:
    with pytest.raises(PayloadError) as info:
        decode_frame(body)
    return info.value


def test_refusals_name_the_field() -> None:
    enc = encode_parts(good())
    body = enc.body
    n = len(enc.head)
    assert refusal(b'{"source": 1}').field == "header"
    assert refusal(patched(body, 4, struct.pack("<H", 2))).field == "version"
    assert refusal(body + b"x").field == "body"
    ts = n + enc.ts_offsets[0]
    assert refusal(patched(body, ts, struct.pack("<d", 1e13))).field == "frames[0].ts"
    assert refusal(patched(body, ts, struct.pack("<d", float("nan")))).field == "frames[0].ts"
    assert refusal(patched(body, ts, struct.pack("<d", float("inf")))).field == "frames[0].ts"
    assert "negative" in refusal(patched(body, ts, struct.pack("<d", -1.0))).message
    for edge in (0.0, MAX_TIMESTAMP):  # the bounds themselves pass
        assert decode_frame(patched(body, ts, struct.pack("<d", edge))).frames[0].ts == edge
    values = n + enc.value_offsets[0]
    assert np.isnan(decode_frame(body).frames[0].values[0, 1])  # not reported: NaN both ways
    inf = refusal(patched(body, values + 8, struct.pack("<d", float("inf"))))
    assert inf.field == "frames[0].values[0][1]"
    # the first metric's string index, after the frame's ts and three counts
    metric_ref = ts + 8 + 12
    err = refusal(patched(body, metric_ref, struct.pack("<I", 99)))
    assert err.field == "frames[0].metrics[0]" and "99" in err.message
    bad_name = Batch("n", [Frame(1.0, ["ok", "not a name"], [{}], np.array([[1.0, 2.0]]))])
    assert refusal(encode_frame(bad_name)).field == "frames[0].metrics[1]"
    bad_label = Batch("n", [Frame(1.0, ["m"], [{"node": "n"}, {"bad-key": "x"}], np.array([[1.0], [2.0]]))])
    assert refusal(encode_frame(bad_label)).field == "frames[0].entities[1].bad-key"
    bad_event = Batch("n", events=[Event(-1.0, "xid", {}, {})])
    assert refusal(encode_frame(bad_event)).field == "events[0].ts"
    assert refusal(head("", None) + body[n:]).field == "source"


def test_a_truncated_frame_names_the_field_and_the_offset() -> None:
    body = encode_frame(good())
    enc = encode_parts(good())
    cut = len(enc.head) + enc.value_offsets[0] + 4  # half-way into the first value
    err = refusal(body[:cut])
    assert err.field == "frames[0].values"
    assert f"ends at byte {cut}" in err.message
    for k in range(len(body)):
        assert refusal(body[:k]).field  # every truncation is refused by name, none crashes


def test_counts_larger_than_the_body_are_refused_before_allocating() -> None:
    enc = encode_parts(good())
    ts = len(enc.head) + enc.ts_offsets[0]
    huge = patched(enc.body, ts + 8, struct.pack("<II", 2, 100_001))
    assert refusal(huge).field == "frames[0].entities"  # over the limit of entities per frame
    huge = patched(enc.body, ts + 8, struct.pack("<II", 1000, 1000))
    assert "ends at byte" in refusal(huge).message


def test_unknown_content_type_is_refused_by_name() -> None:
    with pytest.raises(PayloadError) as info:
        decode_body("text/plain", orjson.dumps({"source": "n"}))
    assert info.value.field == "content-type"


def test_a_repeated_layout_decodes_to_fresh_containers_and_new_values() -> None:
    first = decode_frame(encode_frame(good()))
    first.frames[0].entities[0]["node"] = "changed"  # the receiver owns what it was given
    first.frames[0].metrics.append("extra")
    again = good()
    again.frames[0].values[0, 0] = 61.0
    second = decode_frame(encode_frame(again))
    assert second.frames[0].entities == [{"node": "n", "gpu": "0"}]
    assert second.frames[0].metrics == ["gpu_temp_celsius", "gpu_power_watts"]
    assert second.frames[0].values[0, 0] == 61.0


def test_a_layout_accepted_under_one_limit_is_checked_again_under_another() -> None:
    body = encode_frame(good())
    decode_frame(body)  # the layout is now known under the default limits
    with pytest.raises(PayloadError) as info:
        decode_frame(body, Limits(max_labels=1))
    assert info.value.field == "frames[0].entities[0]"


def test_the_layouts_remembered_are_bounded() -> None:
    for k in range(frame_module._MAX_LAYOUTS + 10):
        b = good()
        b.frames[0].entities[0]["gpu"] = str(k)
        decode_frame(encode_frame(b))
    assert 0 < len(frame_module._layouts) <= frame_module._MAX_LAYOUTS
    assert len(frame_module._tables) <= frame_module._MAX_TABLES


def test_a_frame_names_its_layout_and_a_changed_layout_is_another_number() -> None:
    body = encode_frame(good())
    first, again = decode_frame(body).frames[0], decode_frame(body).frames[0]
    assert first.layout is not None and again.layout == first.layout
    other_gpu = good()
    other_gpu.frames[0].entities[0]["gpu"] = "1"
    other_metric = good()
    other_metric.frames[0].metrics[1] = "gpu_sm_clock_mhz"
    numbers = {decode_frame(encode_frame(b)).frames[0].layout for b in (other_gpu, other_metric)}
    assert first.layout not in numbers and len(numbers) == 2
    assert decode_body("application/json", encode_batch(good())).frames[0].layout is None
    frame_module._layouts.clear()  # forgotten: the same layout gets a number never used before
    assert decode_frame(body).frames[0].layout not in {first.layout, *numbers}
