"""The record half of a remote-backed store, handed to its meta store.

A TSDB keeps series; events, training records, alerts and GPU-time cells live in a
:class:`~gpuscope.store.remote.meta.MetaStore`. :class:`MetaRecords` is the one place that hands
each :class:`~gpuscope.store.base.RecordStore` call over to it, after checking that the store
itself is still open (the meta store may be shared and outlive it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from gpuscope.model import Alert, Event, Labels, TrainingRecord
from gpuscope.store.base import GpuTime
from gpuscope.store.remote.meta import MetaStore


class MetaRecords(ABC):
    """Events, training records, alerts, GPU time and their retention, kept in ``self.meta``."""

    meta: MetaStore

    @abstractmethod
    def _check_open(self) -> None:
        """Raise :class:`~gpuscope.store.errors.StoreError` once the store is closed."""

    def events(
        self,
        start: float,
        end: float,
        kind: str | None = None,
        labels: Labels | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        self._check_open()
        return self.meta.events(start, end, kind, labels, limit)

    def training(
        self, job: str, start: float, end: float, rank: int | None = None, limit: int = 100_000
    ) -> list[TrainingRecord]:
        self._check_open()
        return self.meta.training(job, start, end, rank, limit)

    def save_alert(self, alert: Alert) -> None:
        self._check_open()
        self.meta.save_alert(alert)

    def save_alerts(self, alerts: Sequence[Alert]) -> None:
        self._check_open()
        self.meta.save_alerts(alerts)

    def alerts(self, firing_only: bool = False, limit: int = 1000) -> list[Alert]:
        self._check_open()
        return self.meta.alerts(firing_only, limit)

    def save_gpu_time(self, cells: list[GpuTime]) -> None:
        self._check_open()
        self.meta.save_gpu_time(cells)

    def fold_gpu_time(self, before: float) -> int:
        self._check_open()
        return self.meta.fold_gpu_time(before)

    def gpu_time(self, start: float, end: float) -> list[GpuTime]:
        self._check_open()
        return self.meta.gpu_time(start, end)

    def compact(self, now: float) -> dict[str, int]:
        """Retention of telemetry is the backend's own (a TSDB's ``-retentionPeriod``, ...); this
        applies the meta store's to events, training records, GPU time and batch ids."""
        self._check_open()
        return self.meta.compact(now)
