"""The streaming detection engine: feeds every batch to every detector, collects their findings.

Detectors are found in the registry of :mod:`gpuscope.detect.base`; every module of this package
is imported once so that a new detector module registers itself without being listed anywhere.
The engine owns the shared pre-processing (one GPU table, one step gatherer, one service
aggregator): each frame and record is folded in once, whatever the number of detectors reading it.
One failing detector must not blind the others, so a hook that raises is logged and counted and
the rest carry on.
"""

from __future__ import annotations

import importlib
import logging
import math
import pkgutil

import gpuscope.detect as detect_package
from gpuscope.counters import Counters
from gpuscope.detect import frames
from gpuscope.detect.base import DETECTORS, Detector, Feeds, Tick
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.refusals import refuse
from gpuscope.ingest.overload import Wire
from gpuscope.model import MAX_LAYOUTS, Batch, Finding

log = logging.getLogger(__name__)

_loaded = False
_LOGGED_FAILURES = 5


def load_detectors() -> dict[str, type[Detector]]:
    """Import every module of :mod:`gpuscope.detect` so its detectors register; return the registry."""
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules(detect_package.__path__):
            importlib.import_module(f"{detect_package.__name__}.{module.name}")
        _loaded = True
    return DETECTORS


def _overrides(detector: Detector, hook: str) -> bool:
    return getattr(type(detector), hook) is not getattr(Detector, hook)


class DetectionEngine:
    """Dispatches frames, events and training records to detectors and gathers their findings."""

    def __init__(self, detectors: list[Detector] | None = None, counters: Counters | None = None) -> None:
        if detectors is None:
            registry = load_detectors()
            detectors = [registry[name]() for name in sorted(registry)]
        self.detectors = detectors
        self.counters = counters or Counters()
        metrics = sorted({m for d in detectors if d.feed == "gpu_table" for m in d.metrics})
        self.feeds = Feeds(GpuTable(tuple(metrics), self.counters))
        for detector in detectors:
            detector.attach(self.feeds)
        fed = {d.feed for d in detectors}
        self._table = "gpu_table" in fed
        self._services = "services" in fed
        self._steps = "steps" in fed
        raw = [d for d in detectors if d.feed == "batch"]
        self._on_frames = [d for d in raw if _overrides(d, "on_frames")]
        self._on_frame = [d for d in raw if _overrides(d, "on_frame") and d not in self._on_frames]
        #: per frame layout: the detectors of ``_on_frame`` that read its frames
        self._readers: dict[int, list[Detector]] = {}
        #: the per-GPU-row tests the frame readers ask for, computed for a tick's frames at once
        self._gpu_tests = list(dict.fromkeys(t for d in self._on_frame for t in d.gpu_tests))
        self._on_event = [d for d in detectors if _overrides(d, "on_event")]
        self._on_training = [d for d in raw if _overrides(d, "on_training")]
        self._wire = [d for d in detectors if _overrides(d, "hear_wire")]

    def observe(self, batch: Batch) -> None:
        """Let every detector see one batch."""
        self.observe_many([batch])

    def observe_many(self, batches: list[Batch]) -> None:
        """Let every detector see a tick's batches, in order: the GPU table takes all their GPU
        rows at once (one scatter per run of frames sharing a metric layout), and so do the
        detectors that take a tick's frames at once. The frames are indexed first, and the row
        tests that depend on a row alone (all-NaN, the ECC counters above zero) computed for all
        of them in one pass; then each batch's frames, events and records are dispatched in order.
        The tick's GPU rows are stacked once (:class:`~gpuscope.detect.frames.TickRows`), for the
        row tests, the table's scatter and the detectors that take a tick's frames at once."""
        indexed = [(batch, self._index(batch)) for batch in batches]
        tick = None
        if self._on_frame or self._table or self._on_frames:
            tick = frames.TickRows.of([v for _, vs in indexed for v in vs])
            if self._on_frame and tick.blocks:
                frames.judge_gpu_rows(tick, self._gpu_tests)
        for batch, batch_views in indexed:
            self._observe(batch, batch_views)
        if tick is None:
            return
        if self._table and tick.blocks:
            self.feeds.table.ingest_many(tick)
        for detector in self._on_frames:
            try:
                detector.on_frames(tick)
            except Exception:
                self._failed(detector, "on_frames")

    def _index(self, batch: Batch) -> list[frames.FrameView]:
        """The views of a batch's frames, malformed frames refused (counted and logged)."""
        out: list[frames.FrameView] = []
        for frame in batch.frames:
            if not math.isfinite(frame.ts) or frame.values.shape != (len(frame.entities), len(frame.metrics)):
                shape = (len(frame.entities), len(frame.metrics))
                refuse(
                    self.counters,
                    "detect_frames_refused",
                    "frame from %s refused: ts %r, values of shape %s for %s entities x metrics",
                    batch.source,
                    frame.ts,
                    frame.values.shape,
                    shape,
                )
                continue
            view = frames.index(frame)
            if view.unplaced_gpu_rows:
                self.counters.inc("detect_gpu_rows_without_node", view.unplaced_gpu_rows)
            out.append(view)
        return out

    def _observe(self, batch: Batch, batch_views: list[frames.FrameView]) -> None:
        for view in batch_views:
            frame = view.frame
            frames.select(view)  # what ``frames.view`` returns for it in the detectors
            if self._services:
                self.feeds.services.on_frame(frame)
            for detector in self._frame_readers(view):
                try:
                    detector.on_frame(frame)
                except Exception:
                    self._failed(detector, "on_frame")
        for event in batch.events:
            if not math.isfinite(event.ts):
                self.counters.inc("detect_events_refused")
                continue
            for detector in self._on_event:
                try:
                    detector.on_event(event)
                except Exception:
                    self._failed(detector, "on_event")
        for record in batch.training:
            if not math.isfinite(record.ts):
                self.counters.inc("detect_training_refused")
                continue
            if self._steps:
                self.feeds.steps.add(record)
            for detector in self._on_training:
                try:
                    detector.on_training(record)
                except Exception:
                    self._failed(detector, "on_training")

    def _frame_readers(self, view: frames.FrameView) -> list[Detector]:
        """The detectors whose ``on_frame`` can do something with this frame (most read only some
        kinds of frame: GPU rows, node rows, a service's metrics), decided once per layout."""
        layout = view.frame.layout
        if layout is None:
            return [d for d in self._on_frame if d.reads(view)]
        readers = self._readers.get(layout)
        if readers is None:
            if len(self._readers) >= MAX_LAYOUTS:  # senders with ever-new layouts: start afresh
                self._readers.clear()
            readers = self._readers[layout] = [d for d in self._on_frame if d.reads(view)]
        return readers

    def hear_wire(self, wire: Wire) -> None:
        """Who knocked on the hub lately (:class:`~gpuscope.ingest.overload.Wire`), for the next
        evaluation."""
        for detector in self._wire:
            detector.hear_wire(wire)

    def evaluate(self, now: float) -> list[Finding]:
        """Every finding that holds at ``now`` (the hub's clock: wall time live, simulated in sim-eval)."""
        if not math.isfinite(now):
            raise ValueError(f"evaluation time must be a finite number of seconds, got {now!r}")
        tick = Tick()
        if self._steps:
            tick.steps = list(self.feeds.steps.closed())
            if self.feeds.steps.dropped:
                self.counters.inc("training_records_late", self.feeds.steps.dropped)
                self.feeds.steps.dropped = 0
            if self.feeds.steps.forgotten:
                self.counters.inc("training_jobs_forgotten", self.feeds.steps.forgotten)
                self.feeds.steps.forgotten = 0
        if self._services:
            tick.snapshots = self.feeds.services.snapshots()
            if self.feeds.services.late_rows:
                self.counters.inc("service_rows_late", self.feeds.services.late_rows)
                self.feeds.services.late_rows = 0
        findings: list[Finding] = []
        for detector in self.detectors:
            try:
                findings.extend(detector.evaluate_tick(now, tick))
            except Exception:
                self._failed(detector, "evaluate")
        self.feeds.faults.update(findings)
        return findings

    def learns_first(self) -> dict[str, float]:
        """Per rule: how long after an entity's first report no detector can raise it yet (the
        shortest learning of the detectors raising it; see :meth:`Detector.learns_first`)."""
        out: dict[str, float] = {}
        for detector in self.detectors:
            learning = detector.learns_first()
            for rule in detector.rules:
                out[rule] = min(out.get(rule, math.inf), learning.get(rule, 0.0))
        return {rule: seconds for rule, seconds in out.items() if seconds > 0}

    def replayed(self, now: float) -> None:
        """Tell every detector that what it just saw was replayed history (see Detector.replayed)."""
        for detector in self.detectors:
            try:
                detector.replayed(now)
            except Exception:
                self._failed(detector, "replayed")

    def _failed(self, detector: Detector, hook: str) -> None:
        counter = f"detect_errors_{type(detector).__name__}_{hook}"
        self.counters.inc(counter)
        if self.counters.get(counter) <= _LOGGED_FAILURES:  # a broken hook fails on every batch
            log.exception(
                "detector %s failed in %s (logged %d times at most, all counted)",
                type(detector).__name__,
                hook,
                _LOGGED_FAILURES,
            )

    def stats(self) -> dict[str, int]:
        """The engine's counters plus each detector's (what was malformed, withheld or cleared)."""
        out = self.counters.snapshot()
        for detector in self.detectors:
            counters = getattr(detector, "counters", None)
            if isinstance(counters, Counters):
                for name, value in counters.snapshot().items():
                    out[name] = out.get(name, 0) + value
        return out
