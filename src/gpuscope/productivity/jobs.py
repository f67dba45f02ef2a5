"""What the hub knows of each training job's progress, from its events and training records."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from gpuscope.model import Event, TrainingRecord
from gpuscope.productivity.states import DEGRADED_AT

#: healthy step times a job's baseline keeps, and steps the current pace is judged on
BASELINE_STEPS = 200
RECENT_STEPS = 5
MIN_BASELINE = 20
#: no step for this many baseline step times (and at least STALL_MIN_S) is a stall
STALL_STEPS = 5.0
STALL_MIN_S = 10.0
#: a rank whose heartbeat is this much older than its peers' has gone
BEAT_GAP_S = 5.0


@dataclass(slots=True)
class JobView:
    name: str
    team: str = ""
    started_at: float = -math.inf
    restarted: bool = False
    last_step: int = -1
    last_step_ts: float = -math.inf
    in_checkpoint: set[str] = field(default_factory=set)
    checkpoint_since: float = -math.inf
    baseline: deque[float] = field(default_factory=lambda: deque(maxlen=BASELINE_STEPS))
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    beats: dict[str, float] = field(default_factory=dict)
    outcome: str = ""  # failed | finished once the job is over
    ended_at: float = math.nan  # when it finished or failed
    #: when the first step after the latest (re)start began: the end of its start-up
    first_step_start: float = -math.inf
    #: each of its GPUs' SM clock while computing and its full speed (the highest seen; 0 unknown)
    clocks: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    _clock_at: float = -math.inf
    _clock_slowdown: float = 1.0
    _base: float = math.nan

    def on_event(self, event: Event) -> None:
        rank = event.labels.get("rank", "")
        kind = event.kind
        if kind == "job_started":
            self.started_at = event.ts
            self.restarted = bool(event.data.get("restart"))
            self.team = str(event.data.get("team") or event.labels.get("team") or self.team)
            self.last_step = -1
            self.outcome = ""
            self.ended_at = math.nan
            self.in_checkpoint.clear()
            self.beats.clear()
            self.recent.clear()
            self.clocks.clear()
        elif kind == "checkpoint_started":
            if not self.in_checkpoint:
                self.checkpoint_since = event.ts
            self.in_checkpoint.add(rank)
        elif kind in ("checkpoint_completed", "checkpoint_failed"):
            self.in_checkpoint.discard(rank)
        elif kind == "heartbeat":
            self.beats[rank] = event.ts
        elif kind in ("job_ended", "job_failed"):
            self.outcome = "finished" if kind == "job_ended" else "failed"
            self.ended_at = event.ts
            self.in_checkpoint.clear()
            self.beats.clear()

    def on_record(self, record: TrainingRecord) -> None:
        self.beats[str(record.rank)] = max(self.beats.get(str(record.rank), -math.inf), record.ts)
        if record.step <= self.last_step:
            return
        gap = record.ts - self.last_step_ts
        seconds = record.metrics.get("step_seconds", gap)
        if self.started_at > self.last_step_ts and math.isfinite(seconds):
            self.first_step_start = max(self.started_at, record.ts - seconds)
        self.last_step = record.step
        self.last_step_ts = record.ts
        if record.ts > self.checkpoint_since:
            self.in_checkpoint.clear()  # a later step completed: the checkpoint is over
        if not math.isfinite(seconds) or seconds <= 0:
            return
        self.recent.append(seconds)
        if len(self.baseline) < MIN_BASELINE or seconds <= self._base * DEGRADED_AT:
            self.baseline.append(seconds)
            self._base = statistics.median(self.baseline)

    @property
    def step_time(self) -> float:
        return self._base if len(self.baseline) >= MIN_BASELINE else math.nan

    def slowdown(self) -> float:
        """Current step time over the healthy baseline (1.0 when unknown)."""
        base = self.step_time
        if math.isnan(base) or len(self.recent) < RECENT_STEPS:
            return 1.0
        return statistics.median(self.recent) / base

    def clock_slowdown(self, now: float) -> float:
        """How much the clocks slow the job: synchronous steps wait for the slowest GPU, so the
        slowest clock now against the slowest full speed. A job placed on slower parts from the
        start runs at their pace as its normal, and a faster GPU clocked down to no lower than them
        slows nothing. Recomputed at most once a second, so a large job costs O(GPUs) per second."""
        if now - self._clock_at >= 1.0:
            self._clock_at = now
            known = [c for c in self.clocks.values() if c[1] > 0]
            slowest = min((clock for clock, _ in known), default=0.0)
            full = min((top for _, top in known), default=0.0)
            self._clock_slowdown = full / slowest if slowest > 0 else 1.0
        return self._clock_slowdown

    def status(self, now: float) -> str:
        """One of: startup, restart, checkpoint, hung, collective_wait, running."""
        if self.started_at > self.last_step_ts:
            return "restart" if self.restarted else "startup"
        if self.in_checkpoint:
            return "checkpoint"
        base = self.step_time
        stall_after = max(STALL_MIN_S, STALL_STEPS * (base if math.isfinite(base) else 2.0))
        if now - self.last_step_ts > stall_after:
            newest = max(self.beats.values(), default=-math.inf)
            gone = any(newest - ts > BEAT_GAP_S for ts in self.beats.values())
            return "collective_wait" if gone else "hung"
        return "running"
