"""Frames with nulls (metrics a GPU does not report) are converted at once, and still refused
value by value, with the field named, when anything in them is not a number or null."""

from __future__ import annotations

import math

import pytest

from gpuscope.ingest.payload import PayloadError, parse_frame


def frame(values: list[list[object]]) -> dict[str, object]:
    return {
        "ts": 1.0,
        "metrics": ["a", "b"],
        "entities": [{"gpu": "0"}, {"gpu": "1"}],
        "values": values,
    }


def test_nulls_become_nan_and_numbers_are_kept() -> None:
    f = parse_frame(frame([[1, None], [2.5, 3]]), "frames[0]")
    assert f.values[0, 0] == 1.0 and math.isnan(f.values[0, 1]) and f.values[1].tolist() == [2.5, 3.0]


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ([[1, "2"], [None, 3]], "frames[0].values[0][1]", "must be a number"),
        ([[True, None], [1, 2]], "frames[0].values[0][0]", "must be a number"),
        ([[10**400, None], [1, 2]], "frames[0].values[0][0]", "must be finite"),
        ([[1, None], [1]], "frames[0].values[1]", "has 1 values for 2 metrics"),
        ([[1, None], {"a": 1}], "frames[0].values[1]", "must be a list"),
    ],
)
def test_anything_else_beside_a_null_is_refused_by_its_field(
    values: list[list[object]], field: str, message: str
) -> None:
    with pytest.raises(PayloadError) as err:
        parse_frame(frame(values), "frames[0]")
    assert err.value.field == field and message in err.value.message
