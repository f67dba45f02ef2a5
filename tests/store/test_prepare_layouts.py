"""Row preparation remembers what a decoded frame layout resolved to, and only what is final."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.model import Batch, Frame, Labels
from gpuscope.store.prepare import Preparer
from gpuscope.store.registry import ColumnRegistry, EntityRegistry

METRICS = ["gpu_utilization_percent", "gpu_temp_celsius"]


def decoded(gpus: list[str], ts: float, node: str = "n1") -> Frame:
    """A node's frame as the hub receives it: through the binary frame, with its layout number."""
    entities: list[Labels] = [{"node": node, "gpu": g, "job": "j"} for g in gpus]
    values = np.array([[float(k), 50.0 + k] for k in range(len(gpus))])
    return decode_frame(encode_frame(Batch(node, [Frame(ts, METRICS, entities, values)]))).frames[0]


def stored(preparer: Preparer, frame: Frame) -> list[tuple[str, float]]:
    """(gpu label, first value) of each row the frame prepares to, by the ids it resolved to."""
    prepared = preparer.prepare(Batch("n1", [frame]))
    [block] = prepared.blocks.values()
    entities = preparer.entities
    return [
        (entities.labels(int(e))["gpu"], float(v[0]))
        for e, v in zip(block.entity[0], block.values[0], strict=True)
    ]


def persist_all(preparer: Preparer) -> None:
    """What the writer does once the rows are committed."""
    preparer.entities.mark_persisted(range(len(preparer.entities)))
    preparer.columns.mark_persisted(range(len(preparer.columns)))


def test_a_sender_whose_entity_list_changes_gets_the_ids_of_its_new_entities() -> None:
    preparer = Preparer(EntityRegistry(100), ColumnRegistry(10), ColumnRegistry(10))
    assert stored(preparer, decoded(["0", "1"], 1.0)) == [("0", 0.0), ("1", 1.0)]
    persist_all(preparer)
    # remembered from now on (nothing pending), and the same ids for the same layout
    assert stored(preparer, decoded(["0", "1"], 2.0)) == [("0", 0.0), ("1", 1.0)]
    assert stored(preparer, decoded(["0", "1"], 3.0)) == [("0", 0.0), ("1", 1.0)]
    # the same sender now lists its GPUs in another order, then loses one and gains another
    assert stored(preparer, decoded(["1", "0"], 4.0)) == [("1", 0.0), ("0", 1.0)]
    assert stored(preparer, decoded(["0", "2"], 5.0)) == [("0", 0.0), ("2", 1.0)]
    assert len(preparer.entities) == 3


def test_a_layout_is_remembered_only_once_its_entities_and_columns_are_stored() -> None:
    preparer = Preparer(EntityRegistry(100), ColumnRegistry(10), ColumnRegistry(10))
    first = preparer.prepare(Batch("n1", [decoded(["0"], 1.0)]))
    again = preparer.prepare(Batch("n1", [decoded(["0"], 2.0)]))
    # until the writer has stored them, every batch carries the new entity and columns it uses
    assert first.entities == again.entities == {0}
    assert first.columns == again.columns == {0, 1}
    persist_all(preparer)
    third = preparer.prepare(Batch("n1", [decoded(["0"], 3.0)]))
    assert not third.entities and not third.columns
    [block] = third.blocks.values()
    with pytest.raises(ValueError):  # shared by every later frame of the layout: read-only
        block.entity[0][0] = 7


def test_refused_entities_are_refused_again_and_not_remembered() -> None:
    preparer = Preparer(EntityRegistry(1), ColumnRegistry(10), ColumnRegistry(10))
    persist_all(preparer)
    for ts in (1.0, 2.0):
        prepared = preparer.prepare(Batch("n1", [decoded(["0", "1"], ts)]))
        persist_all(preparer)
        assert prepared.result.refused_entities == 1
        assert prepared.result.samples == 2
