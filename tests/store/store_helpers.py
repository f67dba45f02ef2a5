"""Small frames and batches with known values for the store tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from gpuscope.loadgen.traffic import FleetShape, build_scenario
from gpuscope.model import Batch, Frame, Labels
from gpuscope.sim.cluster import Simulator
from gpuscope.store.duckdb import DuckDBStore


def gpu(node: str, index: int, job: str | None = None) -> Labels:
    labels = {"node": node, "gpu": str(index)}
    if job is not None:
        labels["job"] = job
    return labels


def fleet_batches(count: int, nodes: int = 8) -> list[Batch]:
    """The node and SDK batches of a simulated fleet's first ``count`` ticks (frames, events,
    training records), each with a batch id of its own."""
    scenario = build_scenario(FleetShape(nodes=nodes, job_nodes=4), count + 5)
    out: list[Batch] = []
    for k, tick in enumerate(Simulator(scenario, t0=1.7e9).ticks()):
        for batch in [*tick.node_batches.values(), *tick.sdk_batches]:
            batch.batch_id = f"{batch.source}-{k}"
            out.append(batch)
        if k + 1 == count:
            return out
    raise AssertionError("the scenario ended early")


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
