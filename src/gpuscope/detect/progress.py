"""Step progress of one training job: the highest step, the step-interval baseline, checkpoints in flight.

Every job-level training detector needs the same bookkeeping (is it stepping, how fast usually,
is a checkpoint being written), so it lives here once. In synchronous data-parallel training all
ranks finish step k together, so the job advances when any rank reports a higher step; the
interval between advances (per step) is the job's step time, except across a checkpoint pause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuscope.detect.baseline import RollingMedian
from gpuscope.model import TrainingRecord

ADVANCED, ROLLED_BACK = "advanced", "rolled_back"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(slots=True)
class Progress:
    step: int = -1  # highest completed step; -1 before the first
    step_ts: float = -math.inf  # the job's own time of that step
    intervals: RollingMedian = field(default_factory=lambda: RollingMedian(31))  # seconds per step
    step_seconds: RollingMedian = field(default_factory=lambda: RollingMedian(31))  # as the ranks report
    checkpoint: dict[int, tuple[float, int | None]] = field(default_factory=dict)  # rank -> (start, step)
    checkpointed: bool = False  # a checkpoint ran since the last step: the next interval is no step time
    longest_checkpoint: float = 0.0

    @property
    def started(self) -> bool:
        """Has the job completed its first step (initialisation is over)?"""
        return self.step >= 0

    @property
    def in_checkpoint(self) -> bool:
        return bool(self.checkpoint)

    def record(self, record: TrainingRecord) -> str | None:
        """Apply one rank's step record: :data:`ADVANCED`, :data:`ROLLED_BACK` or None (no news)."""
        self.step_seconds.push(record.metrics.get("step_seconds", math.nan))
        if record.step > self.step:
            if self.step >= 0 and not self.checkpointed and record.ts > self.step_ts:
                self.intervals.push((record.ts - self.step_ts) / (record.step - self.step))
            self.step, self.step_ts = record.step, record.ts
            self.checkpointed = False
            if self.checkpoint:
                self._steps_past_checkpoint(record)
            return ADVANCED
        # a rank one step behind is normal; further back, later in time, is a restart from a checkpoint
        if record.step < self.step - 1 and record.ts > self.step_ts:
            self.step, self.step_ts = record.step, record.ts
            return ROLLED_BACK
        return None

    def _steps_past_checkpoint(self, record: TrainingRecord) -> None:
        """A step after the checkpointed one means that checkpoint is over, even if its end was lost.

        The step a checkpoint saves may be reported in the same batch as its start, so the
        comparison is by step number (by time only when the start event named no step).
        """
        over = [
            rank
            for rank, (started, step) in self.checkpoint.items()
            if (record.step > step if step is not None else record.ts > started)
        ]
        for rank in over:
            del self.checkpoint[rank]

    def checkpoint_started(self, rank: int, ts: float, step: Any) -> None:
        self.checkpoint.setdefault(
            rank, (ts, step if isinstance(step, int) and not isinstance(step, bool) else None)
        )

    def checkpoint_ended(self, rank: int, ts: float, seconds: Any, completed: bool) -> bool:
        """A rank finished (or failed) its checkpoint; True when no rank is still writing one."""
        opened = self.checkpoint.pop(rank, None)
        took = _number(seconds)
        if took is None and opened is not None:
            took = ts - opened[0]
        if completed and took is not None:
            self.longest_checkpoint = max(self.longest_checkpoint, took)
        if self.checkpoint:
            return False
        self.checkpointed = True
        return True

    def baseline(self, warmup_intervals: int = 3) -> float:
        """The usual seconds per step: the median interval once known, else the slowest seen so far
        (a median of two warm-up steps would be too trusting); 0 with nothing to go on."""
        if len(self.intervals) >= warmup_intervals:
            return self.intervals.median()
        seen = (self.intervals.max(), self.step_seconds.median())
        return max((x for x in seen if math.isfinite(x)), default=0.0)
