"""Alert changes on their way to dispatch, off the evaluator's thread: an ordered, bounded queue.

The hub's listener (the evaluation's thread) only puts a change here. One worker takes the changes
in the order they happened, a pass at a time (at most ``PASS_JOBS`` changes or ``PASS_S`` seconds
of playbooks): each fired alert's playbook is run (the slow part: it reads the store), the pass's
playbooks are attached and saved together (one store write), then its changes are dispatched in
order; a resolution or an escalation is dispatched in its turn. Whatever dispatches, dispatches
in queue order, so a resolution never overtakes its alert's own fired notification, even when
both happened inside one burst.

Bounds, so that triage never stops detection nor holds a notification back without limit:

- at most ``size`` changes wait. A change put into a full queue first sheds the oldest one: it is
  dispatched at once, in the listener's thread, without its playbook (``triage_skipped_queue_full``);
- a fired alert that waited more than ``budget`` seconds is dispatched without its playbook
  (``triage_skipped_over_budget``), by the worker when it reaches it or by :meth:`shed_late`
  (the alerting clock, every second) while the worker is still inside a slow playbook. The jobs
  of the worker's pass are shed first, so the order holds.

An alert dispatched without its playbook still carries the playbook's fixed parts (meaning,
impact, mitigation: :func:`gpuscope.alert.service.alert_annotations`); its checks are not run
later, as they would compete with the alerts that keep coming. A playbook the worker was running
when its alert was shed is still attached and saved when it ends (``playbooks_attached_late``):
pages and the API show it, receivers got the alert without it.

Without a running worker (tests, a service built but not started), :meth:`drain` does the
worker's part in the caller's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuscope.alert.engine import AlertChange
from gpuscope.counters import Counters
from gpuscope.model import Labels

log = logging.getLogger("gpuscope.alert.triagequeue")

#: changes that may wait for triage and dispatch: an outage of this many nodes is triaged whole
QUEUE_SIZE = 4096
#: the longest a fired alert waits for its playbook before it is dispatched without it
BUDGET_S = 30.0
#: how long a stopping service triages what is queued before it dispatches the rest without
STOP_DRAIN_S = 10.0
#: the most changes one pass of the worker triages before it saves their playbooks and dispatches
PASS_JOBS = 256
#: a pass takes no further change once its playbooks ran this long (the first waits for the last)
PASS_S = 0.5


@dataclass(slots=True)
class Job:
    change: AlertChange
    #: the service's clock when the hub told the change: a fired alert's ``group_wait`` counts from it
    heard_at: float
    #: monotonic time it was queued: the budget and the oldest wait count from it
    queued: float
    #: dispatched (by the worker, or shed ahead of it), or dropped (another hub continues it)
    done: bool = False
    #: why it was dispatched without its playbook ("": with it, or it needs none)
    skipped: str = ""

    @property
    def triaged(self) -> bool:
        """Whether the job waits for a playbook (only a fired alert's does)."""
        return self.change.kind == "fired"


#: the playbook's part: run it and return what to attach to the alert (no lock of the queue is held)
Triage = Callable[[Job], Any]
#: attach (and save, together) what the playbooks of one pass returned, before they are dispatched
Attach = Callable[[list[tuple[Job, Any]]], None]
#: dispatch a change; ``skipped`` says why a fired alert goes without its playbook ("" when it has it)
Dispatch = Callable[[Job, str], None]


class TriageQueue:
    def __init__(
        self,
        triage: Triage,
        attach: Attach,
        dispatch: Dispatch,
        *,
        size: int = QUEUE_SIZE,
        budget: float = BUDGET_S,
        counters: Counters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 1 or not budget > 0:
            raise ValueError("triage queue: need size >= 1 and budget > 0")
        self.triage = triage
        self.attach = attach
        self.dispatch = dispatch
        self.size = size
        self.budget = budget
        self.counters = counters or Counters()
        self.clock = clock
        self._jobs: deque[Job] = deque()
        self._hands: list[Job] = []  # the worker's pass: taken from the queue, not yet all dispatched
        self._cond = threading.Condition()
        #: held by whoever dispatches, so that jobs are dispatched in the order they were queued
        self._order = threading.Lock()
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- input (the hub's listener) -----------------------------------------------------------

    def put(self, change: AlertChange, heard_at: float) -> None:
        """Queue a change; a full queue first dispatches its oldest change without a playbook."""
        with self._cond:
            full = len(self._jobs) >= self.size
        if full:
            self._shed(lambda _job: True, self.size - 1, "queue full", "triage_skipped_queue_full")
        with self._cond:
            self._jobs.append(Job(change, heard_at, self.clock()))
            self._cond.notify_all()

    # -- the worker -----------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            self._stop = False
        self._thread = threading.Thread(target=self._run, name="gpuscope-triage", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                if not self._jobs:
                    return
            self._work_pass()

    def _work_pass(self, most: int = PASS_JOBS) -> int:
        """Take the oldest jobs (at most ``most``, or until their playbooks ran ``PASS_S``),
        triage them, attach their playbooks in one go, then dispatch them in order; returns how
        many were taken (0: none was queued)."""
        taken: list[tuple[Job, bool]] = []  # (job, late: past the budget when taken)
        found: list[tuple[Job, Any]] = []
        started = time.monotonic()
        try:
            while len(taken) < most and time.monotonic() - started <= PASS_S:
                with self._cond:
                    if not self._jobs:
                        break
                    job = self._jobs.popleft()
                    self._hands.append(job)
                late = self.clock() - job.queued > self.budget
                taken.append((job, late))
                if job.triaged and not late and not job.done:
                    try:
                        found.append((job, self.triage(job)))
                    except Exception:  # triage is help, not a gate: the alert still goes out
                        self.counters.inc("playbook_errors")
                        log.exception("playbook for %s failed", job.change.alert.id)
            if found:
                try:
                    self.attach(found)
                except Exception:  # the alerts still go out, without their playbooks
                    self.counters.inc("playbook_errors", len(found))
                    log.exception("attaching %d playbooks failed", len(found))
            attached = {id(job) for job, _ in found}
            with self._order:
                for job, late in taken:
                    if job.done:  # shed while its playbook ran: attached late, receivers were told
                        if job.skipped and id(job) in attached:
                            self.counters.inc("playbooks_attached_late")
                    else:
                        skipped = "over budget" if job.triaged and late else ""
                        if skipped:
                            self.counters.inc("triage_skipped_over_budget")
                        self._dispatch(job, skipped)
        finally:
            with self._cond:
                self._hands = []
                self._cond.notify_all()
        return len(taken)

    def _dispatch(self, job: Job, skipped: str) -> None:
        """Dispatch one job; the caller holds the order lock."""
        try:
            self.dispatch(job, skipped)
        except Exception:  # the queue must outlive any one failed dispatch
            self.counters.inc("dispatch_errors")
            log.exception("dispatching %s of %s failed", job.change.kind, job.change.alert.id)
        finally:
            with self._cond:
                job.skipped = skipped
                job.done = True
                self._cond.notify_all()

    # -- shedding -------------------------------------------------------------------------------

    def shed_late(self) -> int:
        """Dispatch, without their playbooks, the fired alerts that waited past the budget (and,
        to keep the order, the changes queued before them); returns how many were shed."""
        deadline = self.clock() - self.budget
        return self._shed(lambda job: job.queued < deadline, 0, "over budget", "triage_skipped_over_budget")

    def _shed(self, due: Callable[[Job], bool], keep: int, why: str, counter: str) -> int:
        """Dispatch the oldest jobs while ``due`` holds of them, until ``keep`` remain queued:
        the jobs of the worker's pass first, as they are older than any queued."""
        shed = skipped = 0
        with self._order:
            with self._cond:
                hands = [job for job in self._hands if not job.done]
            for hand in hands:
                if not due(hand):
                    return shed
                skipped += hand.triaged
                self._dispatch(hand, why if hand.triaged else "")
                shed += 1
            while True:
                with self._cond:
                    if len(self._jobs) <= keep or not due(self._jobs[0]):
                        break
                    job = self._jobs.popleft()
                    self._cond.notify_all()
                skipped += job.triaged
                self._dispatch(job, why if job.triaged else "")
                shed += 1
        if skipped:
            self.counters.inc(counter, skipped)
            log.warning("%d alerts dispatched without their playbook: %s", skipped, why)
        return shed

    def forget(self, gone: Callable[[Labels], bool]) -> int:
        """Drop, undispatched, the changes of alerts whose entities another hub now dispatches
        (it continues them from what was sent); returns how many."""
        with self._order, self._cond:
            kept = [j for j in self._jobs if not gone(j.change.alert.entity)]
            dropped = len(self._jobs) - len(kept)
            self._jobs = deque(kept)
            for hand in self._hands:
                if not hand.done and gone(hand.change.alert.entity):
                    hand.done = True
                    dropped += 1
            self._cond.notify_all()
        return dropped

    # -- draining and stopping ------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every change put so far is dispatched (triaged first, within the budget)
        and the worker is idle (a playbook that ended late is attached); without a running
        worker, do its work in this thread. False if ``timeout`` ran out."""
        if not self.running():
            while self._work_pass():
                pass
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._hands:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self, timeout: float = STOP_DRAIN_S) -> None:
        """Triage and dispatch what is queued for up to ``timeout`` seconds, dispatch the rest
        without playbooks, then end the worker."""
        drained = self.drain(timeout)
        if not drained:
            self._shed(lambda _job: True, 0, "hub stopping", "triage_skipped_at_stop")
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)  # a worker still inside a playbook is left behind

    def stats(self) -> dict[str, float]:
        """``depth``: changes not yet dispatched; ``oldest_wait_seconds``: how long the oldest of
        them has waited (0 when none)."""
        now = self.clock()
        with self._cond:
            hands = [job for job in self._hands if not job.done]
            oldest = hands[0] if hands else (self._jobs[0] if self._jobs else None)
            depth = len(self._jobs) + len(hands)
        wait = 0.0 if oldest is None else max(0.0, now - oldest.queued)
        return {"depth": depth, "oldest_wait_seconds": wait}
