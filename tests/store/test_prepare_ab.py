"""Row preparation gives the same rows and counts as before its checks of a frame's values were
cut to fewer numpy calls (A/B: the preparer before the change, kept here, against the one in use),
on a simulated fleet's node batches and on frames with values beyond float32's range, infinite
values and GPUs that reported nothing."""

from __future__ import annotations

import math

import numpy as np

from gpuscope.ingest.frame import decode_frame, encode_frame
from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch, Frame, Labels
from gpuscope.sim.cluster import Simulator
from gpuscope.store.prepare import REFUSED, Prepared, Preparer, RowBlock, _check_ts, _note, to_ms
from gpuscope.store.registry import ColumnRegistry, EntityRegistry


class PreparerBefore(Preparer):
    """The preparer as it was: an errstate a frame, ``ndarray.any``/``all`` on the values."""

    def _frame(self, frame: Frame, where: str, out: Prepared) -> None:
        ts = _check_ts(frame.ts, f"{where}.ts")
        known = None if frame.layout is None else self._resolved.get(frame.layout)
        layout = self._layout(frame.metrics, where) if known is None else known[0]
        values = np.asarray(frame.values, dtype=np.float64)
        if values.shape != (len(frame.entities), len(frame.metrics)):
            raise ValueError(
                f"{where}.values: shape {values.shape} does not match "
                f"{len(frame.entities)} entities x {len(frame.metrics)} metrics"
            )
        if not frame.entities or not frame.metrics:
            return
        result = out.result
        if layout.refused:
            result.refused_samples += int(np.count_nonzero(~np.isnan(values[:, list(layout.refused)])))
            names = ", ".join(frame.metrics[j] for j in layout.refused[:5])
            _note(result, f"{where}: metric column limit ({self.columns.limit}) reached, refused {names}")
        if not layout.cols:
            return
        sub = values if layout.take is None else values[:, layout.take]
        refused: list[Labels]
        pending_ids: list[int]
        if known is not None:
            ids, codes, refused, pending_ids = known[1], known[2], [], []
        else:
            ids, codes, refused, pending_ids = self.entities.resolve(frame.entities)
            if frame.layout is not None and not (refused or pending_ids or layout.pending):
                self._remember(frame.layout, layout, ids, codes)
        if refused:
            ok = ids != REFUSED
            result.refused_entities += len(refused)
            result.refused_samples += int(np.count_nonzero(~np.isnan(sub[~ok])))
            _note(
                result,
                f"{where}: entity limit ({self.entities.max_entities}) reached, "
                f"refused {len(refused)} label set(s) such as {refused[0]}",
            )
            ids, codes, sub = ids[ok], codes[ok], sub[ok]
            if len(ids) == 0:
                return
        with np.errstate(over="ignore", invalid="ignore"):
            f32 = sub.astype(np.float32)
        present = np.isfinite(f32)  # values too large for float32 became inf
        # one count serves both the check and the result (``ndarray.all`` costs several times
        # more than this on a node's frame)
        n_present = int(np.count_nonzero(present))
        if n_present != present.size:
            bad = ~present & ~np.isnan(sub)
            if bad.any():
                n_bad = int(np.count_nonzero(bad))
                result.refused_samples += n_bad
                _note(result, f"{where}: refused {n_bad} value(s) that are infinite or beyond float32 range")
                f32[bad] = np.nan
            rows_with_data = present.any(axis=1)
            if not rows_with_data.all():
                ids, codes, f32 = ids[rows_with_data], codes[rows_with_data], f32[rows_with_data]
                if len(ids) == 0:
                    return
        result.samples += n_present  # rows dropped above had no value present
        block = out.blocks.get(layout.cols)
        if block is None:
            block = out.blocks[layout.cols] = RowBlock(layout.cols)
        stamps = np.empty(len(ids), dtype=np.int64)
        stamps.fill(to_ms(ts))  # np.full's Python wrapper costs more than the array
        block.add(stamps, ids, codes, f32)
        out.entities.update(pending_ids)
        out.columns.update(layout.pending)


def _preparers(max_entities: int = 10_000, max_columns: int = 1_000) -> tuple[Preparer, Preparer]:
    def make(kind: type[Preparer]) -> Preparer:
        return kind(EntityRegistry(max_entities), ColumnRegistry(max_columns), ColumnRegistry(max_columns))

    return make(PreparerBefore), make(Preparer)


def _same(a: Prepared, b: Prepared) -> None:
    assert a.result == b.result
    assert a.blocks.keys() == b.blocks.keys()
    for cols, block in a.blocks.items():
        other: RowBlock = b.blocks[cols]
        assert block.rows == other.rows
        for x, y in zip(
            [*block.ts, *block.entity, *block.attr, *block.values],
            [*other.ts, *other.entity, *other.attr, *other.values],
            strict=True,
        ):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)  # NaN where NaN
    assert (a.entities, a.columns) == (b.entities, b.columns)


def _fleet(ticks: int) -> list[Batch]:
    scenario = build_scenario(FleetShape(nodes=16, job_nodes=4), ticks + 5)
    out: list[Batch] = []
    for k, tick in enumerate(Simulator(scenario, t0=1.7e9).ticks()):
        out += [decode_frame(encode_frame(b)) for b in tick.node_batches.values()]
        if k + 1 == ticks:
            return out
    raise AssertionError("the scenario ended early")


def test_a_fleet_s_node_batches_prepare_to_the_same_rows() -> None:
    before, now = _preparers()
    batches = _fleet(6)
    assert any(np.isnan(f.values).any() for b in batches for f in b.frames)  # the NaN path is taken
    for batch in batches:
        _same(before.prepare(batch), now.prepare(batch))


def test_values_beyond_float32_infinite_or_all_missing_give_the_same_rows_counts_and_notes() -> None:
    before, now = _preparers()
    entities: list[Labels] = [{"node": "n1", "gpu": str(g)} for g in range(6)]
    metrics = ["a", "b", "c"]
    nan = math.nan
    cases = [
        [[1.0, 2.0, 3.0]] * 6,  # all present
        [
            [1.0, nan, 3.0],
            [nan, nan, nan],
            [4.0, 5.0, nan],
            [1e39, 1.0, nan],
            [-math.inf, 2.0, 3.0],
            [nan] * 3,
        ],
        [[math.inf, nan, nan], [nan] * 3, [1e39, -1e39, nan], [nan] * 3, [nan] * 3, [nan] * 3],
        [[nan] * 3] * 6,  # nothing reported
        [[3e38, -3e38, 1e-46]] * 6,  # within float32 (the last rounds to 0)
    ]
    for k, rows in enumerate(cases):
        batch = Batch("n1", [Frame(100.0 + k, metrics, entities, np.array(rows, dtype=np.float64))])
        _same(before.prepare(batch), now.prepare(batch))


def test_refused_entities_and_columns_give_the_same_rows_and_counts() -> None:
    before, now = _preparers(max_entities=3, max_columns=2)
    entities: list[Labels] = [{"node": "n1", "gpu": str(g)} for g in range(5)]
    values = np.array([[1.0, math.nan, 1e39]] * 5)
    values[3] = math.nan
    batch = Batch("n1", [Frame(5.0, ["a", "b", "c"], entities, values)])
    _same(before.prepare(batch), now.prepare(batch))
