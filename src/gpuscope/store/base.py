"""The store seam: an append/query pair (DESIGN §1). DuckDB is the embedded default.

Everything above the store (hub API, dashboard, reports, detector warm-up) uses only this
interface, so a remote TSDB backend can stand in without changing them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuscope.model import Alert, Batch, Event, Labels, TrainingRecord


@dataclass(slots=True)
class AppendResult:
    """What an append stored, and what it refused (counted, never silent)."""

    samples: int = 0
    events: int = 0
    training: int = 0
    refused_entities: int = 0  # label sets refused by the cardinality limit
    refused_samples: int = 0
    duplicate: bool = False  # a batch_id seen before: stored once, acknowledged again
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SeriesPoint:
    ts: float
    value: float


@dataclass(frozen=True, slots=True)
class GpuTime:
    """One cell of the productivity model's rollups: the GPU-seconds (and the lost share of them)
    that ``(node, gpu, job, team, service, cause)`` spent in the bucket ``[bucket, bucket + res)``.
    ``res`` is 60 (minute cells, per GPU) or 3600 (hour cells, ``gpu`` is '')."""

    res: int
    bucket: float
    node: str
    gpu: str
    job: str
    team: str
    service: str
    cause: str
    seconds: float
    lost: float


class RecordStore(Protocol):
    """The store's records: events, training records, alerts and GPU-time cells (documents, not
    series), with their retention. A remote backend keeps these in its meta store."""

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]: ...

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]: ...

    def save_alert(self, alert: Alert) -> None:
        """Insert or update an alert (keyed by its id)."""
        ...

    def save_alerts(self, alerts: Sequence[Alert]) -> None:
        """Insert or update several alerts (keyed by id) in one write: one transaction, all or
        none. An alert listed twice is saved as listed last."""
        ...

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]: ...

    def save_gpu_time(self, cells: list[GpuTime]) -> None:
        """Insert or replace minute cells of GPU time (keyed by everything but the figures)."""
        ...

    def fold_gpu_time(self, before: float) -> int:
        """Move the minute cells that end by ``before`` into hour cells (adding), atomically, so
        hubs sharing the store fold each minute once. Returns minute cells folded."""
        ...

    def gpu_time(self, start: float, end: float) -> list[GpuTime]:
        """Minute and hour cells of GPU time overlapping ``[start, end)``."""
        ...

    def compact(self, now: float) -> dict[str, int]:
        """Apply retention: drop raw rows (and old rollups) past their keep time; rows dropped per table."""
        ...

    def stats(self) -> dict[str, Any]:
        """Row counts, file size, refusals: for health and benchmarks."""
        ...

    def close(self) -> None: ...


#: told what a started append stored once a crash cannot lose it, or why it cannot be stored
Durable = Callable[[AppendResult | Exception], None]


class Store(RecordStore, Protocol):
    """Telemetry (append, series reads, rollups, replay) over :class:`RecordStore`."""

    def append(self, batch: Batch) -> AppendResult:
        """Store a batch durably; when it returns, a crash cannot lose the batch."""
        ...

    def append_then(self, batch: Batch, durable: Durable) -> bool:
        """Start storing a batch without waiting for it to become durable, where the store can:
        True when it took the batch so (refusals found at once are raised, as by :meth:`append`;
        ``durable`` is called later, with the result or a ``StoreError``, from a thread of the
        store's, and must not block), False when it cannot (nothing was done: call
        :meth:`append` on a thread that may wait). For the hub's event loop, which must not wait."""
        ...

    def series(
        self, metric: str, labels: Labels, start: float, end: float, points: int = 300
    ) -> list[SeriesPoint]:
        """One series (entity chosen by ``labels``) over a range, downsampled to at most ``points``
        buckets (mean per bucket), read from raw data or rollups depending on the range."""
        ...

    def snapshot(
        self, metrics: list[str] | None = None, max_age: float | None = None
    ) -> list[dict[str, Any]]:
        """Latest value of each metric for every entity: ``[{"labels": {...}, "ts": t,
        "values": {metric: v}}]``."""
        ...

    def aggregate(self, metric: str, by: str, start: float, end: float) -> list[dict[str, Any]]:
        """Mean, min, max and count of a metric over a range grouped by a label (``node``,
        ``job``, ...): ``[{"group": "node-0", "mean": .., "min": .., "max": .., "count": n}]``."""
        ...

    def replay(
        self,
        start: float,
        end: float,
        nodes: Iterable[str] | None = None,
        jobs: Iterable[str] | None = None,
    ) -> Iterator[Batch]:
        """Stored telemetry frames, events and training records of [start, end] in time order, one
        batch per timestamp, for detector warm-up. With ``nodes`` or ``jobs``, only what names one
        of them (a ``node`` or ``job`` label, a training record's job)."""
        ...

    def rollup(self, now: float) -> dict[str, int]:
        """Bring the 1-minute and 1-hour rollups up to ``now`` (idempotent); rows written per table."""
        ...
