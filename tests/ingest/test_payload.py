"""The wire format: round trips, and every kind of bad input refused with the field named."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest

from gpuscope.ingest.payload import (
    Limits,
    PayloadError,
    batch_to_json,
    decode_json,
    encode_batch,
    parse_batch,
)
from gpuscope.model import Batch, Event, Frame, TrainingRecord


def good() -> dict[str, Any]:
    return {
        "source": "node-0",
        "batch_id": "node-0:1",
        "frames": [
            {
                "ts": 10.0,
                "metrics": ["gpu_temp_celsius", "gpu_power_watts"],
                "entities": [{"node": "node-0", "gpu": "0"}, {"node": "node-0", "gpu": "1", "job": "j"}],
                "values": [[61.0, 500], [None, 480.5]],
            }
        ],
        "events": [
            {"ts": 11.0, "kind": "xid", "labels": {"node": "node-0", "gpu": "1"}, "data": {"code": 79}}
        ],
        "training": [
            {
                "ts": 12.0,
                "job": "j",
                "rank": 3,
                "step": 7,
                "metrics": {"loss": 2.5, "grad_norm": None},
                "labels": {"node": "node-0", "gpu": "1"},
            }
        ],
    }


def test_good_batch_parses() -> None:
    batch = parse_batch(good())
    assert batch.source == "node-0" and batch.batch_id == "node-0:1"
    frame = batch.frames[0]
    assert frame.values.shape == (2, 2)
    assert math.isnan(frame.values[1, 0]) and frame.values[1, 1] == 480.5
    assert batch.sample_count == 3
    assert batch.events[0].data == {"code": 79}
    assert batch.training[0].rank == 3 and math.isnan(batch.training[0].metrics["grad_norm"])


def test_round_trip_through_bytes() -> None:
    batch = Batch(
        source="s",
        frames=[Frame(1.0, ["a_b"], [{"node": "n"}], np.array([[np.nan]]))],
        events=[Event(2.0, "heartbeat", {"job": "j"}, {"step": 3})],
        training=[TrainingRecord(3.0, "j", 0, 1, {"loss": float("nan")}, {})],
    )
    again = parse_batch(decode_json(encode_batch(batch)))
    assert np.isnan(again.frames[0].values).all()
    assert again.events[0].kind == "heartbeat"
    assert math.isnan(again.training[0].metrics["loss"])
    assert batch_to_json(again)["frames"][0]["values"] == [[None]]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.pop("source"), "source"),
        (lambda b: b.update(source=""), "source"),
        (lambda b: b.update(extra=1), "extra"),
        (lambda b: b.update(batch_id=7), "batch_id"),
        (lambda b: b.update(frames={}), "frames"),
        (lambda b: b["frames"][0].update(ts="now"), "frames[0].ts"),
        (lambda b: b["frames"][0].update(ts=-1), "frames[0].ts"),
        (lambda b: b["frames"][0].update(metrics=["bad name"]), "frames[0].metrics[0]"),
        (lambda b: b["frames"][0].update(metrics=["a", "a"]), "frames[0].metrics"),
        (lambda b: b["frames"][0]["entities"][1].update({"bad-key": "x"}), "frames[0].entities[1].bad-key"),
        (lambda b: b["frames"][0]["entities"][0].update(gpu=True), "frames[0].entities[0].gpu"),
        (lambda b: b["frames"][0]["entities"][0].update(gpu="x" * 300), "frames[0].entities[0].gpu"),
        (lambda b: b["frames"][0].update(values=[[1.0, 2.0]]), "frames[0].values"),
        (lambda b: b["frames"][0].update(values=[[1.0], [2.0, 3.0]]), "frames[0].values[0]"),
        (lambda b: b["frames"][0].update(values=[[1.0, "2"], [3.0, 4.0]]), "frames[0].values[0][1]"),
        (lambda b: b["frames"][0].update(values=[["a", "b"], ["c", "d"]]), "frames[0].values[0][0]"),
        (lambda b: b["events"][0].update(kind=None), "events[0].kind"),
        (lambda b: b["events"][0].update(data=[1]), "events[0].data"),
        (lambda b: b["events"][0].update(data={"x": "y" * 20000}), "events[0].data"),
        (
            lambda b: b["events"][0].update(kind="job_started", data={"checkpoint_every": "5m"}),
            "events[0].data.checkpoint_every",
        ),
        (
            lambda b: b["events"][0].update(kind="job_started", data={"checkpoint_every": 0}),
            "events[0].data.checkpoint_every",
        ),
        (
            lambda b: b["events"][0].update(kind="job_started", data={"checkpoint_every": True}),
            "events[0].data.checkpoint_every",
        ),
        (lambda b: b["training"][0].update(rank=-1), "training[0].rank"),
        (lambda b: b["training"][0].update(step=1.5), "training[0].step"),
        (lambda b: b["training"][0].update(job=""), "training[0].job"),
        (lambda b: b["training"][0].update(metrics={"loss": "high"}), "training[0].metrics.loss"),
    ],
)
def test_bad_fields_are_named(mutate: Any, field: str) -> None:
    body = good()
    mutate(body)
    with pytest.raises(PayloadError) as info:
        parse_batch(body)
    assert info.value.field == field, str(info.value)


def test_a_job_may_declare_its_checkpoint_interval_and_older_senders_need_not() -> None:
    body = good()
    body["events"] = [
        {"ts": 1.0, "kind": "job_started", "labels": {"job": "j"}, "data": {"checkpoint_every": 300}},
        {"ts": 1.0, "kind": "job_started", "labels": {"job": "k"}, "data": {"kind": "training"}},
    ]
    declared, older = parse_batch(body).events
    assert declared.data == {"checkpoint_every": 300} and older.data == {"kind": "training"}


def test_limits_are_enforced() -> None:
    limits = Limits(max_body_bytes=100, max_frames=1, max_labels=1)
    with pytest.raises(PayloadError, match="over the limit") as info:
        decode_json(b" " * 101, limits)
    assert info.value.field == "body"
    body = good()
    body["frames"] = body["frames"] * 2
    with pytest.raises(PayloadError) as info:
        parse_batch(body, limits)
    assert info.value.field == "frames"


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,", b"\xff\xfe", b"NaN", b'{"a": NaN}'])
def test_undecodable_bodies(raw: bytes) -> None:
    with pytest.raises(PayloadError) as info:
        decode_json(raw)
    assert info.value.field == "body"


def test_flags_read_as_numbers() -> None:
    body = good()
    body["frames"][0]["values"] = [[1.0, True], [3.0, False]]
    assert parse_batch(body).frames[0].values.tolist() == [[1.0, 1.0], [3.0, 0.0]]


def test_not_an_object() -> None:
    with pytest.raises(PayloadError):
        parse_batch(orjson.loads(b"[1, 2]"))


def test_large_frame_takes_fast_path() -> None:
    values = np.random.default_rng(0).random((1024, 40))
    body = {
        "source": "fleet",
        "frames": [
            {
                "ts": 1.0,
                "metrics": [f"m{j}" for j in range(40)],
                "entities": [{"gpu": str(i)} for i in range(1024)],
                "values": values.tolist(),
            }
        ],
    }
    batch = parse_batch(orjson.loads(orjson.dumps(body)))
    np.testing.assert_array_equal(batch.frames[0].values, values)
