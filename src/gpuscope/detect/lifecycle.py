"""Jobs that die and checkpoints that do not protect them: ``job_failed``, ``checkpoint_failed``,
``checkpoint_corrupt`` and ``checkpoint_overdue``.

A ``job_failed`` event fires at once and holds until the job starts again (or ``hold`` seconds).
A checkpoint fails when a rank reports ``checkpoint_failed`` or when some ranks completed a step's
save and the others did not within ``incomplete_after`` seconds; it is corrupt when verification
says so. Both hold until a later checkpoint is good (every rank completed, not failed
verification) or ``hold`` passes. A checkpoint is overdue when the running job has had no good
one for ``overdue_factor`` times its usual interval: the median gap between good checkpoints,
learned once it has two; before that, the interval the job declared in its ``job_started``
(``checkpoint_every``, seconds, from the training SDK's ``gpuscope.init``), counted from its
start or its one good checkpoint, while its heartbeats' step has advanced within that interval
(a stalled job cannot save: ``training_stalled`` says so). A job that stops saving before its
first checkpoint is overdue by its declared interval; jobs that declared none and never
checkpointed twice are not judged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuscope.counters import Counters
from gpuscope.detect.base import Detector, Feeds, register
from gpuscope.detect.deaths import Death, JobDeaths, exit_death, summary
from gpuscope.detect.jobs import Job, JobTracker, StepsTold, parse_rank, place_labels
from gpuscope.detect.settings import FINISHED_JOB_RETENTION_S, JOB_SWEEP_S
from gpuscope.model import Event, Finding

FAILED, CKPT_FAILED, CORRUPT, OVERDUE = (
    "job_failed",
    "checkpoint_failed",
    "checkpoint_corrupt",
    "checkpoint_overdue",
)


def declared_interval(data: Mapping[str, object]) -> float:
    """The checkpoint interval a ``job_started`` declares (seconds), NaN when it declares none
    (ingest refuses a bad one; an event from elsewhere with one is read as none)."""
    every = data.get("checkpoint_every")
    if isinstance(every, bool) or not isinstance(every, int | float):
        return math.nan
    return float(every) if math.isfinite(every) and every > 0 else math.nan


def _links(job: Job | None) -> list[dict[str, str]]:
    return [{"node": n} for n in job.nodes()] if job is not None else []


@dataclass(slots=True)
class _Save:
    started: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    first_done: float = math.nan


@dataclass(slots=True)
class _Ckpt:
    saves: dict[int, _Save] = field(default_factory=dict)
    goods: list[tuple[int, float]] = field(default_factory=list)  # (step, ts) of good checkpoints
    failure: tuple[float, int, str] | None = None  # (ts, step, reason)
    corrupt: tuple[float, int] | None = None
    since: float = math.nan  # when the job (re)started: the overdue clock starts no earlier
    declared: float = math.nan  # the interval its job_started declared (seconds), if any
    last_ts: float = -math.inf  # its newest checkpoint event


@register
class LifecycleDetector(Detector):
    rules = (FAILED, CKPT_FAILED, CORRUPT, OVERDUE)

    def __init__(
        self,
        hold: float = 1800.0,
        incomplete_after: float = 300.0,
        overdue_factor: float = 2.0,
        settle: float = 2.5,
        silent_window: float = 5.0,
        max_jobs: int = 4096,
        finished_job_retention_s: float = FINISHED_JOB_RETENTION_S,
    ) -> None:
        self.hold, self.incomplete_after, self.overdue_factor = hold, incomplete_after, overdue_factor
        # a failing job's other ranks send their last words within a second or two: wait that
        # long (hub time) so the alert names the first to fail, not the first to arrive
        self.settle, self.silent_window, self.max_jobs = settle, silent_window, max_jobs
        #: a job over for this long (past ``hold`` at least) is forgotten, counted in
        #: ``checkpoint_jobs_forgotten``; so is the state of one nobody started or ended that had
        #: no checkpoint event for as long
        self.finished_job_retention_s = finished_job_retention_s
        self._swept_at = -math.inf
        self.counters = Counters()
        self._jobs = JobTracker(self.counters)
        self._ckpt: dict[str, _Ckpt] = {}
        self._deaths: dict[str, JobDeaths] = {}
        #: how far each job's heartbeats told its step: the engine's shared feeds, which the
        #: training liveness detector feeds (it follows every heartbeat already); until attached,
        #: no job has told a step (none is judged stalled)
        self._told = StepsTold(max_jobs)

    def attach(self, feeds: Feeds) -> None:
        self._told = feeds.told

    def on_event(self, event: Event) -> None:
        kind = event.kind
        if kind == "heartbeat":
            self._beat(event)
            return
        if kind == "process_exited":
            self._exited(event)
            return
        if kind.startswith("job_"):
            job = self._jobs.on_event(event)
            if job is not None and kind == "job_started":
                state = self._state(job.name)
                state.since, state.declared = event.ts, declared_interval(event.data)
                self._deaths.pop(job.name, None)
            elif job is not None and kind == "job_failed":
                self._last_words(job, event)
            elif job is not None and kind == "job_ended":
                self._deaths.pop(job.name, None)
            return
        if not kind.startswith("checkpoint_"):
            return
        name = event.labels.get("job")
        if not name:
            self.counters.inc("checkpoint_events_without_job")
            return
        state = self._state(name)
        state.last_ts = max(state.last_ts, event.ts)
        step = event.data.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else -1
        rank = parse_rank(event.labels.get("rank"))
        rank = -1 if rank is None else rank
        if kind == "checkpoint_verified":
            self._verified(state, event.ts, step, event.data.get("ok"))
            return
        save = state.saves.setdefault(step, _Save())
        if kind == "checkpoint_started":
            save.started.add(rank)
        elif kind == "checkpoint_completed":
            save.completed.add(rank)
            if not math.isfinite(save.first_done):
                save.first_done = event.ts
            if save.completed >= save.started and not save.failed:
                self._good(state, step, event.ts)
        elif kind == "checkpoint_failed":
            save.failed.add(rank)
            reason = event.data.get("reason")
            state.failure = (event.ts, step, str(reason) if reason else "save failed")
        if len(state.saves) > 8:
            del state.saves[min(state.saves)]

    def _job_deaths(self, name: str) -> JobDeaths:
        deaths = self._deaths.get(name)
        if deaths is None:
            if len(self._deaths) >= self.max_jobs:  # jobs that vanished without a word
                del self._deaths[next(iter(self._deaths))]
            deaths = self._deaths[name] = JobDeaths()
        return deaths

    def _beat(self, event: Event) -> None:
        name, rank = event.labels.get("job"), parse_rank(event.labels.get("rank"))
        if not name or rank is None:
            return  # the liveness detector counts malformed heartbeats
        deaths = self._job_deaths(name)
        deaths.beat(rank, event.ts, event.labels.get("node", ""), event.labels.get("gpu", ""))

    def _exited(self, event: Event) -> None:
        name, rank = event.labels.get("job"), parse_rank(event.labels.get("rank"))
        if not name or rank is None:
            self.counters.inc("process_exits_without_job_rank")
            return
        deaths = self._job_deaths(name)
        node = event.labels.get("node", "")
        # the rank's own labels (from its heartbeats) say which GPU it had; the agent's do not
        gpu = deaths.beats.get(rank, (0.0, node, ""))[2]
        death = exit_death(rank, event.ts, node, gpu, event.data)
        if death is not None:
            deaths.exited(death)
        else:
            deaths.clean.add(rank)

    def _last_words(self, job: Job, event: Event) -> None:
        rank = parse_rank(event.labels.get("rank"))
        if rank is None:
            return  # a job-level failure (scheduler, launcher): judged as it is, at once
        deaths = self._job_deaths(job.name)
        data = event.data
        node, gpu = event.labels.get("node", ""), event.labels.get("gpu", "")
        reason = str(data.get("reason") or "failed")
        deaths.spoke(Death(rank, event.ts, reason, str(data.get("cause") or "requested"), node, gpu))

    def _state(self, name: str) -> _Ckpt:
        state = self._ckpt.get(name)
        if state is None:
            state = self._ckpt[name] = _Ckpt()
        return state

    @staticmethod
    def _good(state: _Ckpt, step: int, ts: float) -> None:
        if not state.goods or state.goods[-1][0] != step:
            state.goods.append((step, ts))
            del state.goods[:-32]
        if state.failure is not None and state.failure[1] < step:
            state.failure = None
        if state.corrupt is not None and state.corrupt[1] < step:
            state.corrupt = None

    def _verified(self, state: _Ckpt, ts: float, step: int, ok: object) -> None:
        if ok is False:
            state.corrupt = (ts, step)
            state.goods = [(s, t) for s, t in state.goods if s != step]
        elif ok is True and state.corrupt is not None and state.corrupt[1] < step:
            state.corrupt = None

    def keep_finished_jobs(self, seconds: float) -> None:
        self.finished_job_retention_s = seconds

    def _forget_finished(self, now: float) -> None:
        cutoff = now - max(self.finished_job_retention_s, self.hold)

        def over(name: str) -> bool | None:
            """Whether the job ended before the cutoff; None when the tracker does not know it."""
            job = self._jobs.jobs.get(name)
            if job is None:
                return None
            return not job.running and job.ended_at is not None and job.ended_at < cutoff

        gone = [
            name for name, state in self._ckpt.items() if state.last_ts < cutoff and over(name) is not False
        ]
        for name in gone:
            del self._ckpt[name]
            self._told.forget(name)
        for name in [n for n in self._deaths if over(n)]:
            del self._deaths[name]
        self.counters.inc("checkpoint_jobs_forgotten", len(gone))

    def evaluate(self, now: float) -> list[Finding]:
        if now - self._swept_at >= JOB_SWEEP_S:
            self._swept_at = now
            self._forget_finished(now)
        out: list[Finding] = []
        for known in self._jobs.jobs.values():
            if known.state == "failed" and known.ended_at is not None and now - known.ended_at < self.hold:
                finding = self._failed(known, now)
                if finding is not None:
                    out.append(finding)
        for name, state in self._ckpt.items():
            job = self._jobs.jobs.get(name)
            self._incomplete(state, now)
            if state.failure is not None and now - state.failure[0] < self.hold:
                ts, step, reason = state.failure
                out.append(
                    Finding(
                        CKPT_FAILED,
                        {"job": name},
                        f"Checkpoint of job {name} at step {step} failed: {reason}",
                        details={"step": step, "reason": reason, "failed_at": ts, "links": _links(job)},
                    )
                )
            if state.corrupt is not None and now - state.corrupt[0] < self.hold:
                out.append(
                    Finding(
                        CORRUPT,
                        {"job": name},
                        f"Checkpoint of job {name} at step {state.corrupt[1]} failed integrity verification",
                        details={"step": state.corrupt[1], "links": _links(job)},
                    )
                )
            overdue = self._overdue(state, job, now)
            if overdue is not None:
                out.append(overdue)
        return out

    def _stopped(self, name: str, declared: float, now: float) -> bool:
        """Have the job's heartbeats told no new step for longer than its declared interval?"""
        told = self._told.told(name)
        return told is not None and now - told[1] > declared

    def _incomplete(self, state: _Ckpt, now: float) -> None:
        for step, save in state.saves.items():
            missing = save.started - save.completed - save.failed
            late = math.isfinite(save.first_done) and now - save.first_done >= self.incomplete_after
            if missing and late and not save.failed and -1 not in save.started:
                save.failed |= missing
                ranks = ", ".join(str(r) for r in sorted(missing))
                state.failure = (now, step, f"rank(s) {ranks} never completed the save")

    def _overdue(self, state: _Ckpt, job: Job | None, now: float) -> Finding | None:
        if job is None or not job.running:
            return None
        if len(state.goods) >= 2:
            interval, how = float(np.median(np.diff([ts for _, ts in state.goods]))), "usually one"
        elif math.isfinite(state.declared) and not self._stopped(job.name, state.declared, now):
            # a job whose steps stopped a declared interval ago is stalled (training_stalled's
            # business): it cannot save, and it was not judged by a learned cadence either
            interval, how = state.declared, "it declared one"
        else:
            return None
        last = state.goods[-1][1] if state.goods else state.since
        if not math.isfinite(last):
            return None
        since = max(last, state.since) if math.isfinite(state.since) else last
        silence = now - since
        if interval <= 0 or silence < self.overdue_factor * interval:
            return None
        good = f"last good at step {state.goods[-1][0]}" if state.goods else "none since it started"
        return Finding(
            OVERDUE,
            {"job": job.name},
            f"Job {job.name} has had no good checkpoint for {silence:.0f} s "
            f"({how} every {interval:.0f} s; {good})",
            value=silence,
            affected_gpus=job.world_size,
            details={"seconds_since_good": silence, "interval_seconds": interval, "links": _links(job)},
        )

    def _failed(self, job: Job, now: float) -> Finding | None:
        deaths = self._deaths.get(job.name)
        root, order = (None, []) if deaths is None else deaths.root(self.silent_window)
        if deaths is None or root is None:
            return Finding(
                FAILED,
                {"job": job.name},
                f"Job {job.name} failed: {job.reason or 'exited abnormally'}",
                affected_gpus=job.world_size,
                details={"reason": job.reason, "failed_at": job.ended_at, "links": _links(job)},
            )
        if not math.isfinite(deaths.heard_at):
            deaths.heard_at = now
        if now - deaths.heard_at < self.settle:
            return None
        links = [place_labels(root.node, root.gpu)] if root.node else _links(job)
        return Finding(
            FAILED,
            {"job": job.name},
            summary(job.name, root, order),
            affected_gpus=job.world_size,
            details={
                "reason": root.reason,
                "cause": root.cause,
                "first_rank": root.rank,
                "failed_at": root.ts,
                "exit_code": root.exit_code,
                "signal": root.signal,
                "death_order": [d.as_dict() for d in order],
                "links": links,
            },
        )
