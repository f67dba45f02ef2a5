"""Row preparation of a batch's events and training records gives the same rows as record by
record (A/B: the preparer before the change, kept here, against the one in use): on a simulated
fleet's job batches (heartbeats, step records, quality sketches) and on records it must refuse,
naming the same field. The labels and data are encoded as one list and cut (``json_each``):
exactly what encoding each one gives, whatever the strings hold."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch, Event, TrainingRecord
from gpuscope.sim.cluster import Simulator
from gpuscope.store.prepare import Prepared, Preparer, TrainingRow, json_each
from gpuscope.store.registry import ColumnRegistry, EntityRegistry

SORTED = orjson.OPT_SORT_KEYS
DATA = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS


class PreparerBefore(Preparer):
    """The preparer as it was: each event and record checked and encoded by itself."""

    def _events(self, events: list[Event]) -> list[tuple[float, str, str, str]]:
        return [self._event(e, f"events[{i}]") for i, e in enumerate(events)]

    def _trainings(self, records: list[TrainingRecord], out: Prepared) -> list[TrainingRow]:
        return [self._training(r, f"training[{i}]", out) for i, r in enumerate(records)]


def _preparer(cls: type[Preparer]) -> Preparer:
    return cls(EntityRegistry(10_000), ColumnRegistry(1_000), ColumnRegistry(1_000))


def _rows(p: Prepared) -> tuple[object, ...]:
    training = [(r.ts, r.job, r.rank, r.step, r.labels, r.cols, r.values) for r in p.training]
    return p.events, training, p.train_columns, p.result


@pytest.mark.parametrize(
    "objs",
    [
        [{"job": "a", "rank": "0", "node": "n-1", "gpu": "0"}, {"b": "1", "a": "2"}],
        [{}, {}, {"x": ""}],
        [{"a": "}"}, {"b": "},{"}, {"c": "{"}],
        [{"a": 'ü}"\\'}, {"é": "€"}],
        [{"sketch": {"counts": {"x": 1.0}}}, {"step": 3}],
        [{"step": np.int64(5), "v": np.float32(0.5)}, {"a": [1, {"b": 2}]}],
        [{"only": 1}],
        [],
    ],
)
def test_encoding_a_list_at_once_gives_each_items_own_text(objs: list[dict[str, object]]) -> None:
    assert json_each(objs, DATA) == [orjson.dumps(o, option=DATA).decode() for o in objs]
    if not any(isinstance(v, np.generic) for o in objs for v in o.values()):
        assert json_each(objs, SORTED) == [orjson.dumps(o, option=SORTED).decode() for o in objs]


def test_what_orjson_refuses_raises_as_one_by_one() -> None:
    with pytest.raises(TypeError):
        json_each([{"a": 1}, {"b": object()}], SORTED)


def _job_batches() -> list[Batch]:
    scenario = build_scenario(FleetShape(nodes=32), 40, faults=[])
    out: list[Batch] = []
    for k, tick in enumerate(Simulator(scenario, t0=time.time()).ticks()):
        if k == 35:
            break
        out += [decode_frame(encode_frame(b)) for b in tick.sdk_batches]
    return out


def test_a_fleets_job_batches_give_the_same_rows() -> None:
    batches = _job_batches()
    assert sum(len(b.training) for b in batches) > 100 and sum(len(b.events) for b in batches) > 100
    assert any(e.kind != "heartbeat" for b in batches for e in b.events)
    before, now = _preparer(PreparerBefore), _preparer(Preparer)
    for batch in batches:
        assert _rows(now.prepare(batch)) == _rows(before.prepare(batch))
    before.train_columns.mark_persisted(range(1_000))  # the committed layouts' shortcut too
    now.train_columns.mark_persisted(range(1_000))
    for batch in batches[-20:]:
        assert _rows(now.prepare(batch)) == _rows(before.prepare(batch))


def _event(ts: object = 1.0, kind: object = "heartbeat", labels: object = None, data: object = None) -> Event:
    return Event(ts, kind, {"job": "a"} if labels is None else labels, {"step": 1} if data is None else data)  # type: ignore[arg-type]


def _record(ts: object = 1.0, job: object = "a", rank: object = 0, step: object = 1) -> TrainingRecord:
    return TrainingRecord(ts, job, rank, step, {"loss": 1.0}, {"node": "n"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "batch",
    [
        Batch("s", events=[_event(), _event(ts=5)]),  # an integer time is taken, as a float
        Batch("s", events=[_event(), _event(ts=-1.0)]),
        Batch("s", events=[_event(), _event(ts=float("nan"))]),
        Batch("s", events=[_event(), _event(kind="")]),
        Batch("s", events=[_event(), _event(kind=3)]),
        Batch("s", events=[_event(), _event(data={"x": object()})]),
        Batch("s", events=[_event(labels={"a": "}"}), _event(data={"n": {"m": 1}})]),
        Batch("s", training=[_record(), _record(ts=7)]),
        Batch("s", training=[_record(), _record(rank=-1)]),
        Batch("s", training=[_record(), _record(rank=2**31)]),
        Batch("s", training=[_record(), _record(step=2**63)]),
        Batch("s", training=[_record(), _record(job="")]),
        Batch("s", training=[_record(), _record(ts=1e13)]),
    ],
)
def test_odd_and_refused_records_come_out_as_record_by_record(batch: Batch) -> None:
    def outcome(p: Preparer) -> object:
        try:
            return _rows(p.prepare(batch))
        except ValueError as exc:
            return str(exc)

    assert outcome(_preparer(Preparer)) == outcome(_preparer(PreparerBefore))
