"""The detector seam: detectors see samples, events and training records and emit findings.

A detector is one module that subclasses :class:`Detector` (or one of the fed kinds below) and
decorates it with :func:`register`; the engine finds it in the registry. Detectors are stateful
and streaming (they never query the store on the hot path) and are driven by the data's own
timestamps, so the same code runs live (wall clock) and in ``sim-eval`` (virtual time).

Shared pre-processing is the engine's: a detector declares its ``feed`` and the engine builds one
:class:`~gpuscope.detect.gputable.GpuTable` (latest values per GPU, over the union of the table
detectors' metrics), one :class:`~gpuscope.detect.steps.StepGatherer` (closed training steps)
and one :class:`~gpuscope.detect.services.ServiceAggregator` (per-service snapshots) and hands
them to every detector of that feed through :meth:`Detector.attach`. On its own (tests) a fed
detector builds its own and feeds itself.

``evaluate(now)`` returns every finding whose condition holds *now*: the alert layer turns a
finding that appears into a firing alert and one that disappears into a resolved alert.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from gpuscope.detect.frames import FrameView, TickRows, view
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.hwfaults import HardwareFaults
from gpuscope.detect.jobs import StepsTold
from gpuscope.detect.services import ServiceAggregator, Snapshot
from gpuscope.detect.steps import StepGatherer, StepView
from gpuscope.ingest.overload import Wire
from gpuscope.model import Event, Finding, Frame, TrainingRecord

Feed = Literal["batch", "gpu_table", "steps", "services"]


@dataclass(slots=True)
class Feeds:
    """The engine's shared pre-processing, one of each for all detectors."""

    table: GpuTable
    steps: StepGatherer = field(default_factory=StepGatherer)
    services: ServiceAggregator = field(default_factory=ServiceAggregator)
    #: the hardware findings of the last evaluation (step rules tell a hardware cause from a placement)
    faults: HardwareFaults = field(default_factory=HardwareFaults)
    #: how far each job's heartbeats told its step (fed by the training liveness detector)
    told: StepsTold = field(default_factory=StepsTold)


@dataclass(slots=True)
class Tick:
    """What the shared feeds produced since the last evaluation."""

    steps: list[StepView] = field(default_factory=list)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)


class Detector:
    """Base class: override the ``on_*`` hooks a detector needs and :meth:`evaluate`."""

    #: rule names (:mod:`gpuscope.rules`) this detector can raise
    rules: ClassVar[tuple[str, ...]] = ()
    #: what the engine feeds it: raw batches (the ``on_*`` hooks) or a shared pre-processing
    feed: ClassVar[Feed] = "batch"
    #: the GPU metrics a ``gpu_table`` detector reads
    metrics: ClassVar[tuple[str, ...]] = ()
    #: metric tuples whose per-GPU-row test (:meth:`~gpuscope.detect.frames.FrameView.gpu_positive`)
    #: :meth:`on_frame` reads: the engine computes them for a tick's frames at once
    gpu_tests: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def on_frame(self, frame: Frame) -> None:
        """A telemetry frame arrived (one timestamp, many entities)."""

    def reads(self, frame: FrameView) -> bool:
        """Whether :meth:`on_frame` can change anything for a frame of this one's metrics and
        entities; False only where it would return at once whatever the values. The engine asks
        once per frame layout and skips the detector on the frames of a layout it does not read."""
        return True

    def on_frames(self, tick: TickRows) -> None:
        """A tick's frames at once (``tick.views``, in the order they came; their GPU rows stacked
        per metric layout in ``tick.blocks``, the stacks the engine's row tests read), after the
        tick's events and training records: a detector whose frames never meet its other input
        overrides this instead of :meth:`on_frame` to judge all of a tick's rows in one vectorised
        pass."""
        for v in tick.views:
            self.on_frame(v.frame)

    def on_event(self, event: Event) -> None:
        """An event arrived."""

    def on_training(self, record: TrainingRecord) -> None:
        """A training record arrived."""

    def attach(self, feeds: Feeds) -> None:
        """Read the engine's shared pre-processing instead of one's own."""

    def evaluate(self, now: float) -> list[Finding]:
        """Findings whose condition holds at ``now``."""
        return []

    def evaluate_tick(self, now: float, tick: Tick) -> list[Finding]:
        """Findings at ``now`` when the engine feeds the shared pre-processing (``tick``)."""
        return self.evaluate(now)

    def replayed(self, now: float) -> None:
        """What arrived since the last evaluation was stored history replayed at ``now`` (hub
        start, shard takeover), not live traffic: judge its arrival by its own timestamps."""

    def hear_wire(self, wire: Wire) -> None:
        """Who knocked on the hub lately, before an evaluation (detectors judging senders by their
        silence: a sender that stopped knocking is not silent by the hub's lag)."""

    def keep_finished_jobs(self, seconds: float) -> None:
        """How long the state of a job that ended is kept (detectors holding per-job state)."""

    def learns_first(self) -> dict[str, float]:
        """Per rule it raises: the seconds after an entity's first report in which it only learns
        that entity's baseline and cannot raise the rule (``sim-eval`` says so beside a fault it
        missed). A rule left out is judged from the first report."""
        return {}


class GpuTableDetector(Detector):
    """A vectorised per-GPU rule over the latest values of :attr:`metrics` in a GPU table."""

    feed: ClassVar[Feed] = "gpu_table"

    def __init__(self) -> None:
        self.table = GpuTable(self.metrics)

    def attach(self, feeds: Feeds) -> None:
        self.table = feeds.table

    def on_frame(self, frame: Frame) -> None:
        self.table.ingest(view(frame))


class StepDetector(Detector):
    """A rule over closed training steps: :meth:`step` folds one in, :meth:`findings` judges."""

    feed: ClassVar[Feed] = "steps"

    def __init__(self) -> None:
        self.steps = StepGatherer()
        self.faults = HardwareFaults()

    def attach(self, feeds: Feeds) -> None:
        self.steps = feeds.steps
        self.faults = feeds.faults

    def on_training(self, record: TrainingRecord) -> None:
        self.steps.add(record)

    def step(self, view: StepView) -> None:
        """Fold in one closed step."""

    def findings(self, now: float) -> list[Finding]:
        """Findings that hold at ``now`` over the steps folded in so far."""
        return []

    def evaluate(self, now: float) -> list[Finding]:
        return self.evaluate_tick(now, Tick(steps=list(self.steps.closed())))

    def evaluate_tick(self, now: float, tick: Tick) -> list[Finding]:
        for closed in tick.steps:
            self.step(closed)
        return self.findings(now)


class ServiceDetector(Detector):
    """A rule over per-service snapshots (latency, errors, queue, KV cache of all replicas)."""

    feed: ClassVar[Feed] = "services"

    def __init__(self) -> None:
        self.services = ServiceAggregator()

    def attach(self, feeds: Feeds) -> None:
        self.services = feeds.services

    def on_frame(self, frame: Frame) -> None:
        self.services.on_frame(frame)

    def judge(self, now: float, snapshots: dict[str, Snapshot]) -> list[Finding]:
        """Fold in the services' new snapshots; the findings that hold at ``now``."""
        return []

    def evaluate(self, now: float) -> list[Finding]:
        return self.judge(now, self.services.snapshots())

    def evaluate_tick(self, now: float, tick: Tick) -> list[Finding]:
        return self.judge(now, tick.snapshots)


DETECTORS: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Class decorator: make a detector known to the engine."""
    if cls.__name__ in DETECTORS and DETECTORS[cls.__name__] is not cls:
        raise ValueError(f"two detectors are named {cls.__name__}")
    DETECTORS[cls.__name__] = cls
    return cls


DetectorFactory = Callable[[], Detector]
