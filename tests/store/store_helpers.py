"""Small frames and batches with known values for the store tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from gpuscope.model import Batch, Frame, Labels
from gpuscope.store.duckdb import DuckDBStore


def gpu(node: str, index: int, job: str | None = None) -> Labels:
    labels = {"node": node, "gpu": str(index)}
    if job is not None:
        labels["job"] = job
    return labels


def frame(ts: float, metrics: list[str], entities: list[Labels], values: list[list[float]]) -> Frame:
    return Frame(ts=ts, metrics=metrics, entities=entities, values=np.asarray(values, dtype=np.float64))


def ticks(
    start: int,
    stop: int,
    entities: list[Labels],
    metric: str = "util",
    batch_prefix: str | None = None,
    value: Callable[[int, int], float] = lambda t, i: float(t + i),
) -> Iterator[Batch]:
    """One batch per second; entity i reports value(t, i)."""
    for t in range(start, stop):
        yield Batch(
            source="test",
            frames=[frame(float(t), [metric], entities, [[value(t, i)] for i in range(len(entities))])],
            batch_id=None if batch_prefix is None else f"{batch_prefix}-{t}",
        )


def fill(store: DuckDBStore, start: int, stop: int, n_gpus: int = 2) -> None:
    """GPU i reports util = t + i every second; batches of one minute keep the tests fast."""
    ents = [gpu("n0", i) for i in range(n_gpus)]
    for t0 in range(start, stop, 60):
        frames = [
            frame(float(t), ["util"], ents, [[t + i] for i in range(n_gpus)])
            for t in range(t0, min(t0 + 60, stop))
        ]
        store.append(Batch("test", frames=frames))
