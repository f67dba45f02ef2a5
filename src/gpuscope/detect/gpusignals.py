"""The vectorised per-GPU rules as one registered detector over one shared :class:`GpuTable`.

Error-counter rates (:mod:`~gpuscope.detect.rates`), clocks (:mod:`~gpuscope.detect.clocks`),
idle allocations (:mod:`~gpuscope.detect.idle`) and the failure-risk score
(:mod:`~gpuscope.detect.risk`) read the latest values of overlapping metrics; scattering each
frame once into one table, instead of once per rule family, is most of the per-frame cost.
"""

from __future__ import annotations

from gpuscope.detect.base import Detector, register
from gpuscope.detect.clocks import ClockDetector
from gpuscope.detect.frames import view
from gpuscope.detect.gputable import GpuTable
from gpuscope.detect.idle import IdleAllocationDetector
from gpuscope.detect.rates import ErrorRateDetector
from gpuscope.detect.risk import FailureRiskDetector
from gpuscope.model import Event, Finding, Frame

Judge = ErrorRateDetector | ClockDetector | IdleAllocationDetector | FailureRiskDetector


@register
class GpuSignalsDetector(Detector):
    rules = (
        *ErrorRateDetector.rules,
        *ClockDetector.rules,
        *IdleAllocationDetector.rules,
        *FailureRiskDetector.rules,
    )

    def __init__(self) -> None:
        self.judges: tuple[Judge, ...] = (
            ErrorRateDetector(),
            ClockDetector(),
            IdleAllocationDetector(),
            FailureRiskDetector(),
        )
        metrics = sorted({m for judge in self.judges for m in judge.table.metrics})
        self.table = GpuTable(tuple(metrics))
        for judge in self.judges:
            judge.table = self.table
        self.risk = self.judges[3]

    def on_frame(self, frame: Frame) -> None:
        self.table.ingest(view(frame))

    def on_event(self, event: Event) -> None:
        self.risk.on_event(event)

    def evaluate(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for judge in self.judges:
            out.extend(judge.evaluate(now))
        return out
