"""Stored telemetry read back as batches, for detector warm-up (hub start, shard takeover).

Both backends read rows (time, labels, values per metric), events and training records of a
window; this module filters them by node and job the same way and rebuilds time-ordered batches
shaped like the agents' own: one frame per node and timestamp, holding only metrics it reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from gpuscope.model import Batch, Event, Frame, Labels, TrainingRecord
from gpuscope.store.prepare import to_ms

SOURCE = "replay"
REPLAY_LIMIT = 10_000_000  # training records of one replay window: bounded by the window, not by this


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ms_range(start: float, end: float) -> tuple[int, int]:
    """[start, end] in seconds as a half-open range in ms (both backends' query windows)."""
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"start and end must be finite, got {start!r}, {end!r}")
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    return to_ms(start), to_ms(end) + 1


#: one stored telemetry row: time, entity labels (attribution included), metric -> value
Row = tuple[float, Labels, dict[str, float]]


@dataclass(frozen=True, slots=True)
class Scope:
    """Which nodes and jobs to replay: both None means everything; otherwise only records that name
    one of the given nodes (``node`` label) or jobs (``job`` label, a training record's job)."""

    nodes: frozenset[str] | None = None
    jobs: frozenset[str] | None = None

    @classmethod
    def of(cls, nodes: Iterable[str] | None, jobs: Iterable[str] | None) -> Scope:
        if nodes is None and jobs is None:
            return cls()
        return cls(frozenset(nodes or ()), frozenset(jobs or ()))

    @property
    def everything(self) -> bool:
        return self.nodes is None and self.jobs is None

    def keeps(self, labels: Labels) -> bool:
        if self.everything:
            return True
        return labels.get("node") in (self.nodes or ()) or labels.get("job") in (self.jobs or ())


def check_window(start: float, end: float) -> None:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"replay window: start and end must be finite, got {start!r}, {end!r}")
    if end < start:
        raise ValueError(f"replay window: end ({end}) is before start ({start})")


def batches(
    rows: Iterable[Row], events: Iterable[Event], training: Iterable[TrainingRecord], scope: Scope
) -> Iterator[Batch]:
    """Time-ordered batches, one per timestamp, of what ``scope`` keeps."""
    by_ts: dict[float, Batch] = {}

    def at(ts: float) -> Batch:
        batch = by_ts.get(ts)
        if batch is None:
            batch = by_ts[ts] = Batch(SOURCE)
        return batch

    grouped: dict[tuple[float, str], list[tuple[Labels, dict[str, float]]]] = {}
    for ts, labels, values in rows:
        if values and scope.keeps(labels):
            grouped.setdefault((ts, labels.get("node", "")), []).append((labels, values))
    for (ts, _), members in grouped.items():
        metrics = list(dict.fromkeys(m for _, values in members for m in values))
        grid = np.full((len(members), len(metrics)), np.nan)
        col = {m: j for j, m in enumerate(metrics)}
        for i, (_, values) in enumerate(members):
            for m, v in values.items():
                grid[i, col[m]] = v
        at(ts).frames.append(Frame(ts, metrics, [labels for labels, _ in members], grid))
    for event in events:
        if scope.keeps(event.labels):
            at(event.ts).events.append(event)
    for record in training:
        if scope.keeps({**record.labels, "job": record.job}):
            at(record.ts).training.append(record)
    for ts in sorted(by_ts):
        yield by_ts[ts]
