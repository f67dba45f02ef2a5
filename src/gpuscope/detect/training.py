"""Training liveness: ``training_stalled`` (steps stopped) and ``rank_lost`` (a rank's heartbeat stopped).

A job is stalled when its step counter has not advanced for ``max(2.5 x median step interval, 8 s)``
while it runs. Quiet on purpose: before the first step (initialisation), after the job ended or
failed, and during a checkpoint (steps pause while it is written; then up to 3 x the longest
checkpoint seen, 300 s before any has completed). The finding says whether the job's GPUs are busy
(utilisation of frames labelled with the job) and which rank stopped heartbeating first.

A rank is lost when its heartbeats stop for ``max(4 x its period, 4 s)`` while its job runs. When
every rank of a job goes quiet at once, the job most likely ended and its end event is on the way,
so neither its ranks nor the job are judged for ``whole_job_grace`` more seconds; a job silent for
``abandon_after`` seconds with no end event is presumed gone and forgotten.

Silence is measured on the hub's clock and excused while the hub hears nothing at all, and
while the fleet's heartbeats all arrive late and this rank's are as recent as the fleet's
(:class:`~gpuscope.detect.liveness.Liveness`). Stalls (steps stopped while heartbeats arrive)
and ended jobs are judged as before. A stall also says, as ``event_seconds_since_step``, how long
every rank's own heartbeats, taken and seen here, show the job at one step in the ranks' own time:
evidence that a hub behind on ingest, or one that refused the job's requests, can delay but not
make, so the hub judges such a stall while it is behind (:mod:`gpuscope.gaps`).

After a replay of stored history (hub start, shard takeover), a job whose every rank was already
silent past its threshold is *dormant*: this hub never heard it live, and a job that ended unsaid
(a simulator stopped, a scheduler's kill before any end event) looks the same as a lost one, so
its ranks are not judged one by one. When any of its ranks is heard again it is judged anew, each
rank's silence and the wait for its next step measured from then (a rank that does not come back
is found one threshold later); a dormant job silent for ``abandon_after`` is forgotten. Counted
as ``jobs_silent_before_start``. A job with some ranks still heard is judged as usual, so a rank
lost while the hub was away is still found. What tells a job that died while the hub was down
from one that ended unsaid is its GPUs: when, ``restart_grace`` seconds after the restart, no
rank has been heard but its GPUs are still reported allocated to it after the restart, the job
holds GPUs it does not use: one
``training_stalled`` for the job (not a ``rank_lost`` per rank: one cause), counted as
``jobs_dead_before_start``. A job whose GPUs are no longer reported with it (freed, or the whole
cluster stopped, as a stopped demo's) raises nothing, nor does one that sent its end event. The
grace (25 s) is two and a half of the senders' longest retry delay (10 s), so ranks that spooled
through the restart are heard first, and shorter than the hold on alerts resumed at a restart
(30 s, then ``resolve_after``), so a stall already firing before it goes on as the same alert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, Feeds, register
from gpuscope.detect.baseline import finite_or_none
from gpuscope.detect.frames import GpuKey, view
from gpuscope.detect.jobs import Job, JobTracker, StepsTold, parse_rank, place_labels, place_text
from gpuscope.detect.liveness import Liveness, Overdue
from gpuscope.detect.progress import ROLLED_BACK, Progress
from gpuscope.detect.refusals import refuse
from gpuscope.gaps import STILL_DETAIL
from gpuscope.ingest.overload import Wire, rank_sender
from gpuscope.model import Event, Finding, Frame, TrainingRecord
from gpuscope.rules import RANK_LOST
from gpuscope.rules import TRAINING_STALLED as STALLED

RankKey = tuple[str, int]
_CHECKPOINT = frozenset({"checkpoint_started", "checkpoint_completed", "checkpoint_failed"})
_BUSY_PERCENT = 50.0


@dataclass(slots=True)
class _Run:
    """What this detector tracks of one running training job."""

    progress: Progress = field(default_factory=Progress)
    fresh: bool = False  # progress seen since the last evaluation
    progress_at: float = -math.inf  # hub time progress was last seen
    util: dict[GpuKey, tuple[float, float]] = field(default_factory=dict)  # GPU -> (ts, utilisation)
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> last step its heartbeat reported
    # rank -> (collectives entered, seconds waiting in one) from SDK heartbeats that track collectives
    collectives: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: rank -> (the step its heartbeats tell, the earliest and the latest of its own timestamps
    #: telling it): how long the rank itself says it has not advanced, in its own time
    still: dict[int, tuple[int, float, float]] = field(default_factory=dict)


def _still(still: dict[int, tuple[int, float, float]], rank: int, step: int, ts: float) -> None:
    """A heartbeat of ``rank`` stamped ``ts`` (its own clock) told ``step``."""
    seen = still.get(rank)
    if seen is None or step > seen[0] or (step < seen[0] and ts > seen[2]):  # on, or rolled back
        still[rank] = (step, ts, ts)
    elif step == seen[0]:
        still[rank] = (step, min(seen[1], ts), max(seen[2], ts))
    # a lower step stamped earlier is a heartbeat delivered out of order: no news


def _still_seconds(run: _Run) -> float:
    """How long every rank's own heartbeats, accepted and seen here, show it at one step, in its
    own time: the least over the ranks heard (0 while any rank's do not tell the job's step).

    A hub that is behind on ingest, or that refused the job's requests, delays this evidence but
    cannot make it: what it shows was sent by the ranks themselves, each rank's own timestamps
    compared with each other (no clock skew), and a rank's stream arrives in order (a spool
    replays its batches first), so a step it told before its latest heartbeat cannot still be
    on the way. The least over the ranks: a rank whose data the hub has not caught up on (a
    checkpoint that rank 0 alone writes may sit in its refused requests) shows less. A rank whose
    heartbeats tell a step below the job's records tells nothing (a sender whose heartbeats do
    not follow its steps, or one whose latest heartbeat is older than a step another rank told)."""
    if not run.ranks:
        return 0.0
    least = math.inf
    for rank in run.ranks:
        seen = run.still.get(rank)
        if seen is None or seen[0] < run.progress.step:
            return 0.0
        least = min(least, seen[2] - seen[1])
    return least


@register
class TrainingLivenessDetector(Detector):
    rules = (STALLED, RANK_LOST)

    def __init__(
        self,
        stall_factor: float = 2.5,
        stall_floor: float = 8.0,
        warmup_intervals: int = 3,
        checkpoint_factor: float = 3.0,
        checkpoint_floor: float = 120.0,
        checkpoint_default: float = 300.0,
        rank_factor: float = 4.0,
        rank_floor: float = 4.0,
        whole_job_grace: float = 15.0,
        abandon_after: float = 3600.0,
        restart_grace: float = 25.0,
    ) -> None:
        self.stall_factor = stall_factor
        self.stall_floor = stall_floor
        self.warmup_intervals = warmup_intervals
        self.checkpoint_factor = checkpoint_factor
        self.checkpoint_floor = checkpoint_floor
        self.checkpoint_default = checkpoint_default
        self.whole_job_grace = whole_job_grace
        self.abandon_after = abandon_after
        self.restart_grace = restart_grace
        self.counters = Counters()
        self._jobs = JobTracker(self.counters)
        self._runs: dict[str, _Run] = {}
        self._fresh: list[_Run] = []
        #: job -> hub time a replay found every rank of it silent (its ranks not judged until heard
        #: again; the job is flagged when it still holds its GPUs after ``restart_grace``)
        self._dormant: dict[str, float] = {}
        self._dead: set[str] = set()  # dormant jobs flagged (counted once each)
        self._ranks: Liveness[RankKey] = Liveness(factor=rank_factor, floor=rank_floor, default_interval=1.0)
        self._suppressed = 0
        self._withheld_watermark = 0
        self._found_on_wire = 0
        self._wire = Wire()
        #: how far each job's heartbeats told its step (shared with the checkpoint detector)
        self.told = StepsTold()

    def attach(self, feeds: Feeds) -> None:
        self.told = feeds.told

    # -- input -----------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        self._ranks.traffic()
        kind = event.kind
        if kind == "heartbeat":
            self._heartbeat(event)
        elif kind in _CHECKPOINT:
            self._checkpoint(event)
        else:
            job = self._jobs.on_event(event)
            if job is not None:
                self._lifecycle(job)

    def _lifecycle(self, job: Job) -> None:
        self._dormant.pop(job.name, None)
        self._dead.discard(job.name)
        old = self._runs.pop(job.name, None)
        if old is not None:
            for rank in old.ranks:
                self._ranks.forget((job.name, rank))
        if job.running and job.kind == "training":
            self._runs[job.name] = _Run()

    def _run(self, name: str, ts: float) -> tuple[Job, _Run] | None:
        job = self._jobs.for_traffic(name, ts)
        if job is None:
            return None
        run = self._runs.get(name)
        if run is None:
            run = self._runs[name] = _Run()
        if self._dormant.pop(name, None) is not None:
            self._dead.discard(name)
            for rank in run.ranks:  # heard again: each rank's silence counts from now
                self._ranks.resume((name, rank))
            self._progress(run)  # and so does its wait for a step
        return job, run

    def _rank_of(self, event: Event, step: object) -> tuple[Job, _Run, int] | None:
        name, rank = event.labels.get("job"), parse_rank(event.labels.get("rank"))
        if not name or rank is None:
            refuse(
                self.counters,
                f"{event.kind}_events_malformed",
                "%s event at %s needs labels job and rank (a non-negative integer): %s",
                event.kind,
                event.ts,
                event.labels,
            )
            return None
        self.told.beat(name, step, event.ts)  # also a job that ended: a restart starts from here
        found = self._run(name, event.ts)
        return None if found is None else (*found, rank)

    def _heartbeat(self, event: Event) -> None:
        step = event.data.get("step")
        found = self._rank_of(event, step)
        if found is None:
            return
        job, run, rank = found
        job.place(rank, event.labels)
        if isinstance(step, int) and not isinstance(step, bool):
            run.ranks[rank] = step
            _still(run.still, rank, step, event.ts)
        else:
            run.ranks.setdefault(rank, -1)
        seq, waiting = event.data.get("collective_seq"), event.data.get("collective_waiting_seconds")
        if isinstance(seq, int) and isinstance(waiting, int | float):
            run.collectives[rank] = (seq, float(waiting))
        self._ranks.beat((job.name, rank), event.ts)

    def _checkpoint(self, event: Event) -> None:
        name = event.labels.get("job")
        if not name:
            refuse(
                self.counters,
                f"{event.kind}_events_malformed",
                "%s event at %s lacks label job: %s",
                event.kind,
                event.ts,
                event.labels,
            )
            return
        found = self._run(name, event.ts)
        if found is None:
            return
        _, run = found
        rank = parse_rank(event.labels.get("rank"))
        rank = -1 if rank is None else rank  # a job-level checkpoint event stands for all ranks
        if event.kind == "checkpoint_started":
            run.progress.checkpoint_started(rank, event.ts, event.data.get("step"))
        elif run.progress.checkpoint_ended(
            rank, event.ts, event.data.get("seconds"), event.kind == "checkpoint_completed"
        ):
            self._progress(run)  # the pause is over: measure the next silence from here

    def _progress(self, run: _Run) -> None:
        if not run.fresh:
            run.fresh = True
            self._fresh.append(run)

    def on_training(self, record: TrainingRecord) -> None:
        self._ranks.traffic()
        found = self._run(record.job, record.ts)
        if found is None:
            return
        job, run = found
        job.place(record.rank, record.labels)
        change = run.progress.record(record)
        if change is not None:
            if change == ROLLED_BACK:
                self.counters.inc("training_step_rollbacks")
            self._progress(run)

    def on_frame(self, frame: Frame) -> None:
        self._ranks.traffic()
        v = view(frame)
        for node in v.nodes:
            self._ranks.witness(node, frame.ts)
        if not self._runs:
            return
        util = v.gpu_column("gpu_utilization_percent")
        if util is None:
            return
        runs = self._runs
        for i, job in enumerate(v.gpu_jobs):
            if job is not None:
                run = runs.get(job)
                if run is not None:
                    run.util[v.gpu_keys[i]] = (frame.ts, float(util[i]))

    # -- verdicts --------------------------------------------------------------------------------

    def replayed(self, now: float) -> None:
        self._ranks.replayed(now)
        for name, run in self._runs.items():
            job = self._jobs.jobs.get(name)
            if job is None or not job.running or not run.ranks or name in self._dormant:
                continue
            if all(self._silent((name, rank), now) for rank in run.ranks):
                self._dormant[name] = now
                self.counters.inc("jobs_silent_before_start")

    def _silent(self, key: RankKey, now: float) -> bool:
        heard, threshold = self._ranks.heard_at(key), self._ranks.threshold(key)
        return heard is not None and threshold is not None and now - heard >= threshold

    def hear_wire(self, wire: Wire) -> None:
        self._wire = wire

    def _off_wire(self, key: RankKey, threshold: float) -> bool:
        return self._wire.dead(rank_sender(key[0], str(key[1])), threshold)

    def evaluate(self, now: float) -> list[Finding]:
        overdue = self._ranks.overdue(now, self._off_wire)
        for run in self._fresh:
            run.progress_at = now
            run.fresh = False
        self._fresh.clear()
        for name, since in list(self._dormant.items()):
            if now - since >= self.abandon_after:
                job = self._jobs.jobs.get(name)
                if job is None:
                    del self._dormant[name]
                else:
                    self._abandon(job, now)
        out = self._stalled(now)
        out.extend(self._dead_before_start(now))
        out.extend(self._lost(overdue, now))
        if self._ranks.suppressed > self._suppressed:
            self.counters.inc("rank_verdicts_withheld_hub_gap", self._ranks.suppressed - self._suppressed)
            self._suppressed = self._ranks.suppressed
        if self._ranks.withheld_watermark > self._withheld_watermark:
            self.counters.inc(
                "rank_verdicts_withheld_watermark", self._ranks.withheld_watermark - self._withheld_watermark
            )
            self._withheld_watermark = self._ranks.withheld_watermark
        if self._ranks.found_on_wire > self._found_on_wire:
            self.counters.inc("rank_verdicts_found_on_wire", self._ranks.found_on_wire - self._found_on_wire)
            self._found_on_wire = self._ranks.found_on_wire
        return out

    def stats(self) -> dict[str, float]:
        """How far the ranks' heartbeat watermark lags the hub's clock, and the largest event-time
        silence among the ranks whose verdict the lag withheld at the latest evaluation."""
        return {
            "watermark_lag_seconds": self._ranks.watermark_lag,
            "event_silence_seconds": self._ranks.withheld_event_silence,
        }

    def stall_threshold(self, progress: Progress) -> tuple[float, float]:
        """(seconds without a step that make a stall, the baseline step time behind it)."""
        base = progress.baseline(self.warmup_intervals)
        threshold = max(self.stall_factor * base, self.stall_floor)
        if progress.in_checkpoint:
            longest = progress.longest_checkpoint
            allowance = (
                max(self.checkpoint_factor * longest, self.checkpoint_floor)
                if longest > 0
                else self.checkpoint_default
            )
            threshold = max(threshold, allowance)
        return threshold, base

    def _stalled(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for name, run in self._runs.items():
            job = self._jobs.jobs.get(name)
            if job is None or not job.running or not run.progress.started or name in self._dormant:
                continue
            silence = now - max(run.progress_at, self._ranks.gap_end)
            threshold, base = self.stall_threshold(run.progress)
            if silence < threshold:
                continue
            if self._ranks.withholding:
                self.counters.inc("stall_verdicts_withheld_hub_gap")
                continue
            if self._ending(name, run, now):
                continue
            out.append(self._stall_finding(job, run, silence, threshold, base, now))
        return out

    def _dead_before_start(self, now: float) -> list[Finding]:
        """Dormant jobs that still hold their GPUs ``restart_grace`` after the restart, no rank heard."""
        out: list[Finding] = []
        for name, since in self._dormant.items():
            job, run = self._jobs.jobs.get(name), self._runs.get(name)
            if job is None or run is None or not job.running or now - since < self.restart_grace:
                continue
            held = max((ts for ts, _ in run.util.values()), default=-math.inf)
            # its GPUs reported with it since the restart, and lately: not freed, not a stopped cluster
            if held < since or now - held > self.restart_grace:
                continue
            if self._ranks.withholding:
                self.counters.inc("stall_verdicts_withheld_hub_gap")
                continue
            heard = [at for r in run.ranks if (at := self._ranks.heard_at((name, r))) is not None]
            silence = now - max(heard, default=since)
            threshold, base = self.stall_threshold(run.progress)
            finding = self._stall_finding(job, run, silence, threshold, base, now)
            finding.summary += (
                "; every rank stopped reporting before the hub restarted and none has since, while its "
                "GPUs are still allocated to it"
            )
            finding.details["silent_before_restart"] = True
            out.append(finding)
            if name not in self._dead:
                self._dead.add(name)
                self.counters.inc("jobs_dead_before_start")
        return out

    def _ending(self, name: str, run: _Run, now: float) -> bool:
        """Has every rank just gone quiet together? Then the job is most likely ending, not stalled."""
        if not run.ranks:
            return False  # no heartbeats to judge by
        last = -math.inf
        for rank in run.ranks:
            key = (name, rank)
            heard, threshold = self._ranks.heard_at(key), self._ranks.threshold(key)
            if heard is None or threshold is None or now - heard < threshold:
                return False  # someone is still alive: a real stall
            last = max(last, heard + threshold)
        return now - last < self.whole_job_grace

    def _stall_finding(
        self, job: Job, run: _Run, silence: float, threshold: float, base: float, now: float
    ) -> Finding:
        util = self._job_utilisation(run)
        first = self._first_silent(job, run)
        if util is None:
            busy_text, busy = "GPU utilisation unknown", None
        elif util >= _BUSY_PERCENT:
            busy_text, busy = f"its GPUs are busy ({util:.0f}% utilisation) but not progressing", True
        else:
            busy_text, busy = f"its GPUs are idle ({util:.0f}% utilisation)", False
        summary = (
            f"Training job {job.name} has not advanced past step {run.progress.step} for {silence:.0f} s "
            f"(baseline step {base:.1f} s); {busy_text}"
        )
        if run.progress.in_checkpoint:
            summary += f"; a checkpoint has been open for {now - run.progress_at:.0f} s"
        if first is not None:
            where = place_text(first["node"], first["gpu"])
            summary += f"; rank {first['rank']} on {where} stopped heartbeating first"
        late = self._never_arrived(job, run)
        if late:
            names = ", ".join(f"{r['rank']} ({place_text(r['node'], r['gpu'])})" for r in late)
            summary += f"; rank(s) {names} never arrived at collective #{late[0]['collective']}"
        return Finding(
            STALLED,
            {"job": job.name},
            summary,
            value=silence,
            affected_gpus=job.world_size,
            details={
                "step": run.progress.step,
                "seconds_since_step": silence,
                STILL_DETAIL: _still_seconds(run),
                "threshold_seconds": threshold,
                "baseline_step_seconds": base,
                "in_checkpoint": run.progress.in_checkpoint,
                "gpu_utilization_percent": util,
                "busy": busy,
                "first_silent_rank": first,
                "late_ranks": late,
                "links": self._links(job, first or (late[0] if len(late) == 1 else None)),
            },
        )

    @staticmethod
    def _links(job: Job, first: dict[str, Any] | None) -> list[dict[str, str]]:
        """Where the stall points in the entity graph (for incident grouping): the GPU of the rank
        that went silent first when there is one, else every node the job runs on."""
        if first is not None and first["node"] != "?":
            return [{"node": first["node"], "gpu": first["gpu"]}]
        return [{"node": node} for node in job.nodes()]

    @staticmethod
    def _never_arrived(job: Job, run: _Run) -> list[dict[str, Any]]:
        """Ranks behind the collective their peers wait in (SDK heartbeats: collective_seq, waiting)."""
        waiting = [seq for seq, seconds in run.collectives.values() if seconds > 0]
        if not waiting:
            return []
        target = max(waiting)
        out = []
        for rank, (seq, _) in sorted(run.collectives.items()):
            if seq < target:
                node, gpu = job.placement.get(rank, ("?", "?"))
                out.append({"rank": rank, "node": node, "gpu": gpu, "collective": target, "entered": seq})
        return out

    @staticmethod
    def _job_utilisation(run: _Run) -> float | None:
        if not run.util:
            return None
        newest = max(ts for ts, _ in run.util.values())
        recent = [u for ts, u in run.util.values() if ts >= newest - 5.0 and math.isfinite(u)]
        return finite_or_none(sum(recent) / len(recent)) if recent else None

    def _first_silent(self, job: Job, run: _Run) -> dict[str, Any] | None:
        """The rank whose heartbeat stopped earliest, if any stopped while others went on."""
        heard = [
            (at, rank) for rank in run.ranks if (at := self._ranks.heard_at((job.name, rank))) is not None
        ]
        if len(heard) < 2:
            return None
        newest = max(at for at, _ in heard)
        at, rank = min(heard)
        if newest - at < 2.0:
            return None
        node, gpu = job.placement.get(rank, ("?", "?"))
        return {"rank": rank, "node": node, "gpu": gpu, "silent_since": at}

    def _lost(self, overdue: list[Overdue[RankKey]], now: float) -> list[Finding]:
        by_job: dict[str, list[Overdue[RankKey]]] = {}
        for late in overdue:
            by_job.setdefault(late.key[0], []).append(late)
        out: list[Finding] = []
        for name, lates in by_job.items():
            job = self._jobs.jobs.get(name)
            run = self._runs.get(name)
            if job is None or run is None or not job.running:
                for late in lates:
                    self._ranks.forget(late.key)
                continue
            if name in self._dormant:
                continue
            if len(lates) >= len(run.ranks):  # the whole job is quiet
                if min(late.silence for late in lates) >= self.abandon_after:
                    self._abandon(job, now)
                    continue
                if max(late.silence - late.threshold for late in lates) < self.whole_job_grace:
                    continue  # it went quiet together: give its end event time to arrive
            out.extend(self._lost_finding(job, run, late) for late in lates)
        return out

    def _abandon(self, job: Job, now: float) -> None:
        """Every rank silent for ``abandon_after``: the job is gone even though no end was reported.
        Its alerts resolve and its state is dropped, so a vanished job neither pages forever nor
        holds memory."""
        self._jobs.close(job.name, now, f"every rank silent for {self.abandon_after:.0f} s")
        self._lifecycle(job)
        self.counters.inc("jobs_presumed_gone")

    @staticmethod
    def _lost_finding(job: Job, run: _Run, late: Overdue[RankKey]) -> Finding:
        rank = late.key[1]
        entity = {"job": job.name, "rank": str(rank)}
        where = ""
        if rank in job.placement:
            entity.update(place_labels(*job.placement[rank]))
            where = f" on {place_text(*job.placement[rank])}"
        step = run.ranks.get(rank, -1)
        at_step = f" at step {step}" if step >= 0 else ""
        return Finding(
            RANK_LOST,
            entity,
            f"Rank {rank} of job {job.name}{where} stopped heartbeating{at_step} {late.silence:.0f} s ago",
            value=late.silence,
            details={
                "silence_seconds": late.silence,
                "threshold_seconds": late.threshold,
                "last_step": step,
                "last_heartbeat_ts": finite_or_none(late.last_ts),
                "event_silence_seconds": finite_or_none(late.event_silence),
                "watermark_lag_seconds": late.watermark_lag,
            },
        )
