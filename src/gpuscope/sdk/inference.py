"""The inference SDK: ``svc = gpuscope.serve(service=..., model=..., version=...)``.

``with svc.request() as r:`` times one request (``r.first_token()``, ``r.tokens(n)``,
``r.error()``; an exception counts as a failure); ``svc.queue_depth(n)``, ``svc.batch_size(n)``
and ``svc.memory(weights=..., kv_cache=...)`` set gauges; ``svc.predict(prediction,
confidence=..., features={...})`` samples model outputs and inputs for drift; ``svc.business(name,
value)`` reports a downstream metric. The serving thread pays one bounded deque append per call;
a background thread (:class:`_Shipper`) turns requests into per-second series (rates, p50/p95/p99
of latency, time to first token and inter-token latency) and predictions into sketches
(:mod:`gpuscope.quality.sketch`) sent every ``sketch_interval`` — never raw predictions. It
delivers through the agent's :class:`~gpuscope.agent.sender.Sender` and spool. Every series and
sketch carries the version that served it; :meth:`Service.set_version` switches it.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.ingest.frame import encode_frame
from gpuscope.model import Batch, Event, Frame, Labels
from gpuscope.quality.sketch import CategorySketch, NumericSketch, Sketch

log = logging.getLogger("gpuscope.sdk.inference")
_perf = time.perf_counter
_time = time.time

#: (end wall time, seconds, ttft or -1, tokens, failed, version)
RequestRecord = tuple[float, float, float, int, bool, str]


class RequestTimer:
    """One request; ``with svc.request() as r:``. Cheap: a few attribute writes and one append."""

    __slots__ = ("failed", "n_tokens", "svc", "t0", "ttft")

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.ttft = -1.0
        self.n_tokens = 0
        self.failed = False
        self.t0 = 0.0

    def __enter__(self) -> RequestTimer:
        self.t0 = _perf()
        return self

    def first_token(self) -> None:
        if self.ttft < 0:
            self.ttft = _perf() - self.t0

    def tokens(self, n: int = 1) -> None:
        if self.ttft < 0:
            self.ttft = _perf() - self.t0
        self.n_tokens += n

    def error(self) -> None:
        self.failed = True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = _perf() - self.t0
        q = self.svc._requests
        if len(q) < self.svc.capacity:
            q.append(
                (_time(), seconds, self.ttft, self.n_tokens, self.failed or exc is not None, self.svc.version)
            )
        else:
            self.svc.dropped_requests += 1


class Service:
    """One serving process of ``service`` reporting to a hub. Create with :func:`serve`."""

    def __init__(
        self,
        service: str,
        model: str,
        version: str,
        hub: str,
        *,
        token: str | None = None,
        node: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        capacity: int = 100_000,
        flush_interval: float = 1.0,
        sketch_interval: float = 10.0,
        spool_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        for name, value in (("service", service), ("model", model), ("version", version)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if capacity < 1 or flush_interval <= 0 or sketch_interval <= 0:
            raise ValueError("capacity, flush_interval and sketch_interval must be positive")
        self.service, self.model, self.version = service, model, version
        self.node = node or socket.gethostname().split(".")[0]
        self.capacity = capacity
        self.counters = Counters()
        self._requests: deque[RequestRecord] = deque()
        self._predictions: deque[tuple[str, Any, Any, dict[str, Any] | None]] = deque()
        self._business: deque[tuple[str, str, float]] = deque()
        self.gauges: dict[str, float] = {}
        self.dropped_requests = 0
        self.dropped_predictions = 0
        state = Path(state_dir) if state_dir is not None else _default_state_dir(service)
        spool = Spool(state / "spool", max_bytes=spool_bytes, counters=self.counters)
        self.sender = Sender(hub, spool=spool, token=token, counters=self.counters, timeout=5.0)
        self._shipper = _Shipper(self, flush_interval, sketch_interval)
        self._closed = False
        self._shipper.start()
        atexit.register(self.close)

    # -- hot path --------------------------------------------------------------------------------

    def request(self) -> RequestTimer:
        return RequestTimer(self)

    def queue_depth(self, n: float) -> None:
        self.gauges["inference_queue_depth"] = float(n)

    def batch_size(self, n: float) -> None:
        self.gauges["inference_batch_size"] = float(n)

    def memory(self, *, weights: float | None = None, kv_cache: float | None = None) -> None:
        """GPU memory split of this service, in bytes: model weights vs KV cache."""
        if weights is not None:
            self.gauges["inference_memory_weights_bytes"] = float(weights)
        if kv_cache is not None:
            self.gauges["inference_memory_kv_cache_bytes"] = float(kv_cache)

    def predict(
        self, prediction: Any, confidence: float | None = None, features: dict[str, Any] | None = None
    ) -> None:
        """Sample one prediction (number or category), its confidence and input features for drift."""
        if len(self._predictions) < self.capacity:
            self._predictions.append((self.version, prediction, confidence, features))
        else:
            self.dropped_predictions += 1

    def business(self, name: str, value: float) -> None:
        """A downstream business metric (click-through, conversion) with its own baseline on the hub."""
        if len(self._business) < self.capacity:
            self._business.append((self.version, name, float(value)))

    def set_version(self, version: str) -> None:
        """A new version serves from now on (requests already timed keep the old one)."""
        self.version = version

    # -- life ------------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {
            "dropped_requests": self.dropped_requests,
            "dropped_predictions": self.dropped_predictions,
            **self.counters.snapshot(),
        }

    def flush(self, timeout: float = 10.0) -> None:
        """Ship everything queued now (tests, shutdown), sketches included."""
        deadline = time.monotonic() + timeout
        self._shipper.tick(force_sketch=True, deadline=deadline)
        self.sender.flush(deadline=deadline)

    def close(self, timeout: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._shipper.stop(timeout)
        self.flush(timeout)
        self.sender.close()


def _default_state_dir(service: str) -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in service)
    return Path(state) / "gpuscope" / "serve" / f"{safe}-{os.getpid()}"


def _percentiles(values: list[float], prefix: str, out: dict[str, float]) -> None:
    if values:
        p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
        out[f"{prefix}_p50_seconds"], out[f"{prefix}_p95_seconds"] = float(p50), float(p95)
        out[f"{prefix}_p99_seconds"] = float(p99)


class _Shipper(threading.Thread):
    """Aggregates queued requests into series and predictions into sketches; delivers them."""

    def __init__(self, svc: Service, flush_interval: float, sketch_interval: float) -> None:
        super().__init__(name=f"gpuscope-serve-{svc.service}", daemon=True)
        self.svc = svc
        self.flush_interval = flush_interval
        self.sketch_interval = sketch_interval
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._next_sketch = self._last + sketch_interval
        self._sketches: dict[tuple[str, str, str], Sketch] = {}
        self._latency: dict[str, tuple[NumericSketch, list[float]]] = {}
        self._ids = itertools.count()
        self._prefix = f"serve:{svc.service}:{os.getpid()}:{int(_time() * 1000)}"

    def run(self) -> None:
        while not self._halt.wait(self.flush_interval):
            try:
                self.tick()
            except Exception:  # serving must never die of its monitoring
                self.svc.counters.inc("sdk_internal_errors")
                log.exception("gpuscope: inference SDK thread error (counted; continuing)")

    def stop(self, timeout: float) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def tick(self, force_sketch: bool = False, deadline: float | None = None) -> None:
        with self._lock:
            now = time.monotonic()
            dt, self._last = max(now - self._last, 1e-3), now
            frames = self._series(dt)
            self._sample_predictions()
            events: list[Event] = []
            if force_sketch or now >= self._next_sketch:
                self._next_sketch = now + self.sketch_interval
                events = self._sketch_events()
            if frames or events:
                batch = Batch(f"sdk:{self.svc.service}", frames=frames, events=events)
                batch.batch_id = f"{self._prefix}:{next(self._ids)}"
                self.svc.sender.submit(encode_frame(batch), batch.sample_count, deadline=deadline)

    def _labels(self, version: str) -> Labels:
        s = self.svc
        return {"service": s.service, "model": s.model, "version": version, "node": s.node}

    def _series(self, dt: float) -> list[Frame]:
        q = self.svc._requests
        by_version: dict[str, list[RequestRecord]] = {}
        while q:
            rec = q.popleft()
            by_version.setdefault(rec[5], []).append(rec)
        rows: list[tuple[Labels, dict[str, float]]] = []
        ts = _time()
        for version, recs in by_version.items():
            values: dict[str, float] = {
                "inference_requests_per_second": sum(1 for r in recs if not r[4]) / dt,
                "inference_errors_per_second": sum(1 for r in recs if r[4]) / dt,
            }
            ok = [r for r in recs if not r[4]]
            _percentiles([r[1] for r in ok], "inference_latency", values)
            _percentiles([r[2] for r in ok if r[2] >= 0], "inference_ttft", values)
            _percentiles(
                [(r[1] - r[2]) / (r[3] - 1) for r in ok if r[2] >= 0 and r[3] > 1], "inference_itl", values
            )
            rows.append((self._labels(version), values))
            sk, counts = self._latency.setdefault(version, (NumericSketch(alpha=0.01), [0.0, 0.0]))
            for r in recs:
                counts[0] += 1
                counts[1] += r[4]
                if not r[4]:
                    sk.add(r[1])
        gauges = dict(self.svc.gauges)
        if gauges:
            mine = next((v for lbl, v in rows if lbl["version"] == self.svc.version), None)
            if mine is None:
                rows.append((self._labels(self.svc.version), gauges))
            else:
                mine.update(gauges)
        business: dict[tuple[str, str], list[float]] = {}
        bq = self.svc._business
        while bq:
            version, name, value = bq.popleft()
            business.setdefault((version, name), []).append(value)
        for (version, name), vals in business.items():
            rows.append(
                (self._labels(version) | {"metric": name}, {"model_business_metric": float(np.mean(vals))})
            )
        return [_frame(ts, labels, values) for labels, values in rows]

    def _sample_predictions(self) -> None:
        q = self.svc._predictions
        while q:
            version, pred, conf, feats = q.popleft()
            self._add(version, "prediction", "prediction", pred)
            if conf is not None:
                self._add(version, "confidence", "confidence", conf)
            for name, value in (feats or {}).items():
                self._add(version, "input", str(name), value)

    def _add(self, version: str, signal: str, feature: str, value: Any) -> None:
        key = (version, signal, feature)
        sk = self._sketches.get(key)
        numeric = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        if sk is None:
            sk = self._sketches[key] = NumericSketch(alpha=0.01) if numeric else CategorySketch()
        if isinstance(sk, NumericSketch):
            if numeric:
                sk.add(float(value))
            else:
                self.svc.counters.inc("sdk_type_mismatch")
        else:
            sk.add(value)

    def _sketch_events(self) -> list[Event]:
        ts = _time()
        events = [
            Event(
                ts,
                "quality_sketch",
                self._labels(version) | {"signal": signal, "feature": feature},
                {"sketch": sk.to_json()},
            )
            for (version, signal, feature), sk in self._sketches.items()
            if sk.count
        ]
        for version, (sk, counts) in self._latency.items():
            if counts[0]:
                data = {"requests": counts[0], "errors": counts[1], "latency": sk.to_json()}
                events.append(Event(ts, "serving_window", self._labels(version), data))
        self._sketches.clear()
        self._latency.clear()
        return events


def _frame(ts: float, labels: Labels, values: dict[str, float]) -> Frame:
    names = sorted(values)
    return Frame(ts, names, [labels], np.array([[values[n] for n in names]], dtype=np.float64))


def serve(
    service: str,
    model: str,
    version: str,
    hub: str | None = None,
    *,
    token: str | None = None,
    **options: Any,
) -> Service:
    """Start reporting one serving process; hub and token default to ``GPUSCOPE_HUB``/``GPUSCOPE_TOKEN``."""
    hub = hub or os.environ.get("GPUSCOPE_HUB")
    if not hub:
        raise ValueError("no hub: pass gpuscope.serve(..., hub='http://HOST:7470') or set GPUSCOPE_HUB")
    return Service(service, model, version, hub, token=token or os.environ.get("GPUSCOPE_TOKEN"), **options)
