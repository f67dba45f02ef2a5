"""The remote-write encoder against the protobuf library: what it assembles from cached series heads
and numpy-built sample fields must parse into exactly the messages the library builds itself."""

from __future__ import annotations

import math

import cramjam
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuscope.store.remote import wire

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # UTF-8 has no surrogates
LABELS = st.lists(st.tuples(TEXT, TEXT), max_size=6, unique_by=lambda kv: kv[0])
FRAME = st.tuples(INT64, st.lists(st.tuples(LABELS, st.floats(width=64)), min_size=1, max_size=8))


def library_request(frames: list[tuple[int, list[tuple[list[tuple[str, str]], float]]]]) -> bytes:
    """The oracle: the same request built message by message with the protobuf library."""
    req = wire.WriteRequest()
    for ts_ms, series in frames:
        for labels, value in series:
            ts = req.timeseries.add()
            for name, text in sorted(labels):
                ts.labels.add(name=name, value=text)
            ts.samples.add(timestamp=ts_ms, value=value)
    out: bytes = req.SerializeToString(deterministic=True)
    return out


def assembled_request(frames: list[tuple[int, list[tuple[list[tuple[str, str]], float]]]]) -> bytes:
    heads: list[bytes] = []
    fields: list[bytes] = []
    for ts_ms, series in frames:
        size = wire.sample_size(ts_ms)
        heads += [wire.series_head(labels, size) for labels, _ in series]
        fields += wire.samples(ts_ms, np.array([v for _, v in series], dtype=np.float64))
    return bytes(cramjam.snappy.decompress_raw(wire.write_request(heads, fields)))


@settings(max_examples=200, deadline=None)
@given(st.lists(FRAME, min_size=1, max_size=4))
@example([(0, [([], 0.0)])])
@example([(1_700_000_000_000, [([("__name__", "m"), ("node", 'a"\n')], -0.0), ([], math.nan)])])
@example([(-1, [([("", "")], math.inf)]), (2**63 - 1, [([("x" * 200, "ü" * 300)], -1e308)])])
def test_assembled_requests_parse_into_the_messages_the_library_builds(
    frames: list[tuple[int, list[tuple[list[tuple[str, str]], float]]]],
) -> None:
    parsed = wire.WriteRequest()
    parsed.ParseFromString(assembled_request(frames))
    # compared serialized: the library's own canonical form, and NaN payloads compare bit for bit
    assert parsed.SerializeToString(deterministic=True) == library_request(frames)


def test_float32_values_and_every_timestamp_width_round_trip() -> None:
    values = np.array([0.1, 1e-7, 3.4e38, -2.5, 0.0, np.nan], dtype=np.float32)
    for ts_ms in [0, 1, 127, 128, 2**35, 1_700_000_000_123, 2**62]:
        heads = [wire.series_head([("node", "n"), ("__name__", "m")], wire.sample_size(ts_ms))] * len(values)
        decoded = wire.decode(wire.write_request(heads, wire.samples(ts_ms, values)))
        assert [labels for labels, _ in decoded] == [[("__name__", "m"), ("node", "n")]] * len(values)
        got = np.array([s[0][1] for _, s in decoded], dtype=np.float64)
        np.testing.assert_array_equal(got, values.astype(np.float64))  # float32 exactly, NaN included
        assert {s[0][0] for _, s in decoded} == {ts_ms}
    assert wire.HEADERS["Content-Encoding"] == "snappy"


def test_a_label_that_is_not_utf8_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        wire.series_head([("node", "\ud800")], wire.sample_size(0))
