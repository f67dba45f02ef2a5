"""The step-by-step training rules as one registered detector over one shared step gatherer.

Loss and gradient rules (:mod:`~gpuscope.detect.loss`), rank-against-peers rules
(:mod:`~gpuscope.detect.ranks`) and step time (:mod:`~gpuscope.detect.pace`) all read the same
closed steps; gathering them once instead of three times keeps the per-record cost of a large
job flat. Each judge also works on its own (tests drive them one at a time).
"""

from __future__ import annotations

from gpuscope.detect.base import Detector, register
from gpuscope.detect.loss import LossDetector
from gpuscope.detect.pace import PaceDetector
from gpuscope.detect.ranks import RankDetector
from gpuscope.detect.steps import StepGatherer
from gpuscope.model import Event, Finding, TrainingRecord


@register
class StepwiseDetector(Detector):
    rules = (*LossDetector.rules, *RankDetector.rules, *PaceDetector.rules)

    def __init__(self) -> None:
        self.steps = StepGatherer()
        self.loss = LossDetector()
        self.ranks = RankDetector()
        self.pace = PaceDetector()
        self.judges: tuple[LossDetector | RankDetector | PaceDetector, ...] = (
            self.loss,
            self.ranks,
            self.pace,
        )
        for judge in self.judges:
            judge._steps = self.steps
        self.counters = self.loss.counters

    def on_training(self, record: TrainingRecord) -> None:
        self.steps.add(record)

    def on_event(self, event: Event) -> None:
        for judge in self.judges:
            judge.on_event(event)

    def evaluate(self, now: float) -> list[Finding]:
        views = list(self.steps.closed())
        out: list[Finding] = []
        for judge in self.judges:
            for view in views:
                judge.step(view)
            out.extend(judge.findings(now))
        if self.steps.dropped:
            self.counters.inc("training_records_late", self.steps.dropped)
            self.steps.dropped = 0
        return out
