"""The frame decoder reads a body whose string table and layouts it knows in place
(``frame._known``), and gives the batch, or the refusal naming the field, of the checked decoder
(``frame._checked``, the decoder before that path, which every other body still takes): A/B on a
simulated fleet's node and SDK batches, and on those bodies cut short, with each byte changed, with
bytes after the end, with infinite values and with a source or batch id beyond ASCII."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscope.ingest import frame as frame_module
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.ingest.payload import Limits, PayloadError
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch, Event, TrainingRecord
from gpuscope.sim.cluster import Simulator
from gpuscope.store import log_codec

Outcome = Batch | tuple[str, str]


def _fleet(ticks: int) -> list[bytes]:
    scenario = build_scenario(FleetShape(nodes=4, job_nodes=2), ticks + 5)
    out: list[bytes] = []
    for k, tick in enumerate(Simulator(scenario, t0=1.7e9).ticks()):
        for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
            batch.batch_id = f"{batch.source}-{k}"
            out.append(encode_frame(batch))
        if k + 1 == ticks:
            return out
    raise AssertionError("the scenario ended early")


def _outcome(decode: object, body: bytes, limits: Limits) -> Outcome:
    try:
        return decode(body, limits)  # type: ignore[operator, no-any-return]
    except PayloadError as exc:
        return exc.field, exc.message


def _same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same(new: Outcome, old: Outcome) -> None:
    if not isinstance(new, Batch) or not isinstance(old, Batch):
        assert new == old  # the same refusal: field and message
        return
    assert (new.source, new.batch_id, new.events) == (old.source, old.batch_id, old.events)
    assert new.wire == old.wire
    assert [(f.ts, f.metrics, f.entities, f.layout) for f in new.frames] == [
        (f.ts, f.metrics, f.entities, f.layout) for f in old.frames
    ]
    for a, b in zip(new.frames, old.frames, strict=True):
        assert a.values.dtype == b.values.dtype and a.values.flags.writeable
        np.testing.assert_array_equal(a.values, b.values)
    assert [(t.ts, t.job, t.rank, t.step, t.labels, list(t.metrics)) for t in new.training] == [
        (t.ts, t.job, t.rank, t.step, t.labels, list(t.metrics)) for t in old.training
    ]
    for a, b in zip(new.training, old.training, strict=True):
        assert all(_same_number(a.metrics[m], b.metrics[m]) for m in a.metrics)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many decodes took the checked path (the rest were read in place)."""
    calls = [0]
    checked = frame_module._checked

    def counting(body: bytes, limits: Limits, logged: bool = False) -> Batch:
        calls[0] += 1
        return checked(body, limits, logged)

    monkeypatch.setattr(frame_module, "_checked", counting)
    return calls


def test_a_fleets_batches_decode_in_place_to_the_batches_of_the_checked_decoder(counted: list[int]) -> None:
    bodies = _fleet(20)  # training records from tick 18
    limits = Limits()
    old = [_outcome(frame_module._checked, b, limits) for b in bodies]
    checked_before = counted[0]
    for body, want in zip(bodies, old, strict=True):
        assert_same(_outcome(decode_frame, body, limits), want)
    assert counted[0] == checked_before  # every one read in place: their layouts were known
    assert all(isinstance(o, Batch) for o in old)
    assert any(isinstance(o, Batch) and o.training for o in old)
    assert any(isinstance(o, Batch) and o.events for o in old)


def _mutants(body: bytes) -> list[bytes]:
    out = [body[:n] for n in range(len(body))]  # cut short anywhere
    for i in range(len(body)):  # each byte changed
        out.append(body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :])
        out.append(body[:i] + bytes([(body[i] + 1) & 0xFF]) + body[i + 1 :])
    out += [body + b"\x00", body + b"\x00\x00\x00\x00"]  # bytes after the end
    return out


def test_bad_bodies_are_refused_naming_the_field_the_checked_decoder_names(counted: list[int]) -> None:
    bodies = _fleet(20)
    limits = Limits()
    node = next(b for b in bodies if b"gpu" in b)
    sdk = next(b for b in reversed(bodies) if decode_frame(b, limits).training)  # records in its extras
    for body in (node, sdk):
        decode_frame(body, limits)  # its table and layouts are known: the mutants start in place
        refused = 0
        for mutant in _mutants(body):
            new = _outcome(decode_frame, mutant, limits)
            old = _outcome(frame_module._checked, mutant, limits)
            assert_same(new, old)
            refused += not isinstance(new, Batch)
        assert refused > len(body)


def test_infinite_values_and_names_beyond_ascii_give_the_checked_decoders_answers() -> None:
    bodies = _fleet(1)
    node = next(b for b in bodies if b"gpu" in b)
    limits = Limits()
    decode_frame(node, limits)
    batch = decode_frame(node, limits)
    f = batch.frames[0]
    at = node.index(f.values.astype("<f8").tobytes())  # the first frame's values, in the body
    cases = []
    for value in (math.inf, -math.inf, math.nan, 1e300):
        values = f.values.copy()
        values[len(f.entities) - 1, len(f.metrics) - 1] = value
        raw = values.astype("<f8").tobytes()
        cases.append(node[:at] + raw + node[at + len(raw) :])
    for source in ("nöde", "n" * 200, ""):
        cases.append(encode_frame(Batch(source, frames=batch.frames, batch_id="b")))
    for batch_id in ("ïd", "i" * 129, "i" * 128, None):
        cases.append(encode_frame(Batch("n", frames=batch.frames, batch_id=batch_id)))
    for body in cases:
        assert_same(_outcome(decode_frame, body, limits), _outcome(frame_module._checked, body, limits))
    assert _outcome(decode_frame, cases[0], limits) == (
        f"frames[0].values[{len(f.entities) - 1}][{len(f.metrics) - 1}]",
        "must be finite (NaN = not reported)",
    )


def test_a_logged_record_decodes_to_the_batch_its_checks_made() -> None:
    """An ingest-log record was checked when it was taken: the hub builds its events and training
    records without the checks again, and gets the batch the checked decoder makes (int times,
    label values and metrics as the checks turn them, a NaN loss, no labels, no data)."""
    odd = Batch(
        "sdk:job-9",
        events=[
            Event(1_700_000_000, "heartbeat", {"job": "job-9", "rank": 3}, {"step": 7}),  # type: ignore[dict-item]
            Event(1.7e9 + 0.5, "checkpoint_saved", {}),
        ],
        training=[
            TrainingRecord(1_700_000_001, "job-9", 3, 7, {"loss": math.nan, "tokens": 4096}),  # type: ignore[arg-type]
            TrainingRecord(1.7e9 + 2.25, "job-9", 4, 7, {"loss": 2.5}, {"node": "n-1", "gpu": 0}),  # type: ignore[dict-item]
        ],
        batch_id="b-9",
    )
    bodies = [*_fleet(20), encode_frame(odd)]
    for body in bodies:
        want = frame_module._checked(body, log_codec.TRUSTED)
        got = log_codec.decode(body)
        assert_same(got, want)
        assert [type(e.ts) for e in got.events] == [float] * len(got.events)
        assert [type(t.ts) for t in got.training] == [float] * len(got.training)
    odd_back = log_codec.decode(bodies[-1])
    assert odd_back.events[0].labels == {"job": "job-9", "rank": "3"}
    assert odd_back.training[1].labels == {"node": "n-1", "gpu": "0"}
    tokens, loss = odd_back.training[0].metrics["tokens"], odd_back.training[0].metrics["loss"]
    assert tokens == 4096.0 and math.isnan(loss)
    assert sum(len(log_codec.decode(b).training) for b in bodies) > 2
