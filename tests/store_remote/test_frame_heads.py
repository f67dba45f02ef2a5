"""What a PromStore writes for an agent's repeated frames: its frame-layout cache of series heads
(the same layout every tick) changes nothing on the wire, on a hit, a miss or after eviction."""

from __future__ import annotations

import contextlib
import http.server
from collections.abc import Iterator

import numpy as np

from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.remote import wire
from gpuscope.store.remote.prom_store import PromStore
from support import loopback_http

T0 = 1_700_000_000.0
METRICS = ["gpu_temp_celsius", "bad-name", "gpu_utilization_percent"]


def _frame(k: int) -> Frame:
    entities = [
        {"node": "n1", "gpu": "0", "job": "train-a"},
        {"node": "n1", "gpu": "1"},
        {"node": "n1", "gpu": "2", "__x": "1"},
    ]
    values = np.arange(9.0).reshape(3, 3) + k
    values[1, 2] = np.nan  # not reported this tick
    return Frame(T0 + k, METRICS, entities, values)


def _expected(k: int) -> list[wire.Series]:
    """The series a TSDB must receive for tick ``k``: valid names and labels, reported values."""
    f = _frame(k)
    out: list[wire.Series] = []
    for i, labels in enumerate(f.entities):
        for j, name in enumerate(f.metrics):
            v = float(np.float32(f.values[i, j]))
            if name == "bad-name" or "__x" in labels or v != v:
                continue
            out.append((sorted([("__name__", name), *labels.items()]), [(round(f.ts * 1000), v)]))
    return sorted(out)


@contextlib.contextmanager
def _capture() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with loopback_http(Handler) as url:
        yield url, bodies


def test_repeated_frames_write_exactly_their_samples_with_and_without_cache_room() -> None:
    for cache in (1_000_000, 2):  # room for everything; room for nothing (evicted every time)
        with _capture() as (url, bodies):
            store = PromStore(f"{url}/api/v1/write", url, DuckDBStore(":memory:"), label_cache_series=cache)
            for k in range(4):
                result = store.append(Batch("n1", frames=[_frame(k)]))
                assert result.samples == len(_expected(k))
                assert result.refused_samples == 9 - 1 - len(_expected(k))  # one cell was NaN
                assert sorted(wire.decode(bodies[-1])) == _expected(k)
            store.close()
