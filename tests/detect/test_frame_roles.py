"""The detectors' frame index: the row roles of a decoded layout are derived once and shared."""

from __future__ import annotations

import numpy as np

from gpuscope import model as model_module
from gpuscope.detect import frames
from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.model import Batch, Frame, positions

METRICS = ["gpu_utilization_percent", "gpu_temp_celsius"]


def decoded(entities: list[dict[str, str]], util: list[float]) -> Frame:
    values = np.array([[u, 60.0] for u in util])
    return decode_frame(encode_frame(Batch("n1", [Frame(1.0, METRICS, entities, values)]))).frames[0]


def test_frames_of_one_layout_share_their_roles_and_read_their_own_values() -> None:
    entities = [{"node": "n1"}, {"node": "n1", "gpu": "0", "job": "a"}, {"node": "n1", "gpu": "1"}]
    first, second = decoded(entities, [1.0, 2.0, 3.0]), decoded(entities, [4.0, 5.0, 6.0])
    assert first.layout == second.layout
    a, b = frames.index(first), frames.index(second)
    assert a.gpu_keys is b.gpu_keys  # derived once for the layout
    assert b.gpu_keys == [("n1", "0"), ("n1", "1")] and b.gpu_jobs == ["a", None]
    assert b.node_rows == {"n1": 0} and b.nodes == ["n1"]
    column = b.gpu_column("gpu_utilization_percent")
    assert column is not None and column.tolist() == [5.0, 6.0]
    first_column = a.gpu_column("gpu_utilization_percent")
    assert first_column is not None and first_column.tolist() == [2.0, 3.0]


def test_a_changed_entity_list_gets_its_own_roles() -> None:
    before = frames.index(decoded([{"node": "n1", "gpu": "0"}, {"node": "n1", "gpu": "1"}], [1.0, 2.0]))
    after = frames.index(decoded([{"node": "n1", "gpu": "1"}, {"node": "n1", "gpu": "2"}], [3.0, 4.0]))
    assert before.gpu_keys == [("n1", "0"), ("n1", "1")]
    assert after.gpu_keys == [("n1", "1"), ("n1", "2")]
    undecoded = Frame(1.0, METRICS, [{"node": "n2", "gpu": "0"}], np.array([[7.0, 60.0]]))
    assert frames.index(undecoded).gpu_keys == [("n2", "0")]  # no layout: derived afresh


def test_column_positions_have_one_home_per_layout_shared_by_every_reader() -> None:
    entities = [{"node": "n1", "gpu": "0"}]
    first, second = decoded(entities, [1.0]), decoded(entities, [2.0])
    shared = positions(first)
    assert positions(second) is shared == {"gpu_utilization_percent": 0, "gpu_temp_celsius": 1}
    assert frames.index(second)._columns is shared  # the detectors' view reads the same map
    column = second.column("gpu_temp_celsius")
    assert column is not None and column.tolist() == [60.0] and second.column("gpu_power_watts") is None
    # a frame without a layout number keeps its own, read again once its metrics list is another
    plain = Frame(1.0, ["b", "a", "b"], entities, np.array([[1.0, 2.0, 3.0]]))
    assert positions(plain) == {"b": 0, "a": 1}  # the first of a name given twice, as list.index
    plain.metrics, plain.values = ["a", "c"], np.array([[4.0, 5.0]])
    assert positions(plain) == {"a": 0, "c": 1}
    column = plain.column("c")
    assert column is not None and column.tolist() == [5.0]


def test_the_layouts_whose_positions_are_kept_are_bounded() -> None:
    for k in range(model_module.MAX_LAYOUTS + 10):
        positions(Frame(1.0, METRICS, [], np.zeros((0, 2)), layout=10**9 + k))
    assert 0 < len(model_module._by_layout) <= model_module.MAX_LAYOUTS
