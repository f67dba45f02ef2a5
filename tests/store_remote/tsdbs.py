"""Real TSDBs on loopback for the remote-backend tests (VictoriaMetrics and Prometheus, Debian packages)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscope.model import Batch
from gpuscope.store.base import AppendResult, Durable, Store
from gpuscope.store.remote.local import LocalTSDB, start_prometheus, start_victoria_metrics
from gpuscope.store.remote.prom_store import PromStore
from support import need_binary

BINARIES = {"victoriametrics": "victoria-metrics", "prometheus": "prometheus"}
BACKENDS = ["duckdb", "victoriametrics", "prometheus"]


def start_tsdb(kind: str) -> LocalTSDB:
    binary = need_binary(BINARIES[kind], BINARIES[kind])
    return start_victoria_metrics(binary) if kind == "victoriametrics" else start_prometheus(binary)


class ReadYourWrites(PromStore):
    """A PromStore whose appends are searchable at once: VictoriaMetrics makes new samples
    searchable within about a second; tests ask it to do so now instead of sleeping."""

    def __init__(self, db: LocalTSDB, *args: Any, **kwargs: Any) -> None:
        super().__init__(db.write_url, db.url, *args, **kwargs)
        self.db = db

    def append(self, batch: Batch) -> AppendResult:
        result = super().append(batch)
        self.db.flush()
        return result

    def append_then(self, batch: Batch, durable: Durable) -> bool:
        def flushed(outcome: AppendResult | Exception) -> None:
            self.db.flush()
            durable(outcome)

        return super().append_then(batch, flushed)


StoreFactory = Callable[..., Store]
