"""The run object a training script holds: ``log``, ``step``, ``checkpoint``, ``finish``.

The training thread's cost is one bounded deque append per call (``log`` with 3 metrics is well
under the 2 µs budget of DESIGN §6); everything else happens on the SDK's thread
(:mod:`gpuscope.sdk.shipper`). Drops are counted (``stats()``, and every heartbeat carries them
to the hub), never silent.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuscope.agent.sender import Sender
from gpuscope.agent.spool import Spool
from gpuscope.counters import Counters
from gpuscope.kube.metadata import own_pod
from gpuscope.model import Event
from gpuscope.sdk.checkpoint import CheckpointReporter, CheckpointScope, dcp_rank_files
from gpuscope.sdk.collectives import CollectiveTracker, DdpWatch
from gpuscope.sdk.env import Placement
from gpuscope.sdk.goodput import Goodput, GoodputReport
from gpuscope.sdk.lastwords import LastWords, exception_cause
from gpuscope.sdk.manifest import Verification
from gpuscope.sdk.memory import cuda_memory_sampler
from gpuscope.sdk.shipper import Queues, Shipper

log = logging.getLogger("gpuscope.sdk")
_time = time.time
_perf = time.perf_counter


def default_state_dir(placement: Placement) -> Path:
    """``$XDG_STATE_HOME/gpuscope/sdk/<job>/rank-<r>`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    safe_job = "".join(c if c.isalnum() or c in "-_." else "_" for c in placement.job)
    return Path(state) / "gpuscope" / "sdk" / safe_job / f"rank-{placement.rank}"


class StepTimer:
    """``with run.step():`` times one step and reports ``step_seconds`` (and throughput, MFU)."""

    __slots__ = ("flops", "run", "samples", "step", "t0", "tokens")

    def __init__(self, run: Run, step: int, tokens: float | None, samples: float | None, flops: float | None):
        self.run, self.step, self.tokens, self.samples, self.flops = run, step, tokens, samples, flops
        self.t0 = 0.0

    def __enter__(self) -> StepTimer:
        run = self.run
        run._step = self.step
        if run._first_step:
            run._first_step = False
            run.goodput.first_step(_time())
        self.t0 = _perf()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            return
        seconds = _perf() - self.t0
        metrics: dict[str, float] = {"step_seconds": seconds}
        if seconds > 0:
            if self.tokens is not None:
                metrics["tokens_per_second"] = self.tokens / seconds
            if self.samples is not None:
                metrics["samples_per_second"] = self.samples / seconds
            flops = self.flops if self.flops is not None else self.run.flops_per_step
            if flops is not None and self.run.peak_flops:
                metrics["mfu_ratio"] = flops / seconds / self.run.peak_flops
        self.run.queues.put((_time(), self.step, metrics))


class _Timed:
    """Times a block and books it as one kind of badput (``data_wait``, ``restore``)."""

    __slots__ = ("kind", "run", "t0")

    def __init__(self, run: Run, kind: str) -> None:
        self.run, self.kind, self.t0 = run, kind, 0.0

    def __enter__(self) -> None:
        self.t0 = _perf()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = _perf() - self.t0
        if self.kind == "data_wait":  # part of the step it precedes: accounted with that step's record
            self.run.queues.put((_time(), self.run.current_step(), {"data_wait_seconds": seconds}))
        else:
            self.run.goodput.add(self.kind, seconds)


def _save_arguments(args: tuple[Any, ...], step: int | None) -> tuple[Any, str | os.PathLike[str], int]:
    """(obj, path, step) from ``save``'s three accepted forms."""
    if step is not None and len(args) == 2:
        return args[0], args[1], step
    if step is None and len(args) == 3:
        first, second, third = args
        if type(first) is int:
            return second, third, first
        if type(third) is int:
            warnings.warn(
                "run.save(obj, path, step) is deprecated: use run.save(step, obj, path)",
                DeprecationWarning,
                stacklevel=3,
            )
            return first, second, third
    raise TypeError("run.save takes (step, obj, path) or (obj, path, step=step)")


class Run:
    """One rank of one training job reporting to a hub. Create with :func:`gpuscope.init`."""

    def __init__(
        self,
        placement: Placement,
        hub: str,
        *,
        token: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        capacity: int = 100_000,
        flush_interval: float = 0.25,
        heartbeat_interval: float = 1.0,
        memory_interval: float | None = 5.0,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        checkpoint_every: float | None = None,
        spool_bytes: int = 64 * 1024 * 1024,
        last_words: bool = True,
        last_words_timeout: float = 3.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        declared: dict[str, float] = {}
        if checkpoint_every is not None:
            every = checkpoint_every
            if type(every) not in (int, float) or not 0 < every < math.inf:
                raise ValueError(f"checkpoint_every must be a positive number of seconds, got {every!r}")
            declared["checkpoint_every"] = float(every)
        self.placement = placement
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.counters = Counters()
        self.queues = Queues(capacity)
        self.started_at = _time()
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir(placement)
        self.goodput = Goodput(self.started_at, self.state_dir / "goodput.json")
        self._step = -1
        self._logged = -1
        self._first_step = True
        self._finished = False
        self._lock = threading.Lock()
        self.collectives: CollectiveTracker | None = None
        self._ddp_watch: DdpWatch | None = None
        spool = Spool(self.state_dir / "spool", max_bytes=spool_bytes, counters=self.counters)
        identity = {"job": placement.job, "rank": str(placement.rank)}
        self.sender = Sender(
            hub, spool=spool, token=token, counters=self.counters, timeout=5.0, sender=identity
        )
        self.checkpoints = CheckpointReporter(placement, self.queues.event, self.goodput)
        samplers = []
        if memory_interval is not None:
            sampler = cuda_memory_sampler(placement.local_rank)
            if sampler is not None:
                samplers.append((memory_interval, sampler))
        if placement.rank == 0:
            self.queues.event(
                Event(
                    self.started_at,
                    "job_started",
                    {"job": placement.job},
                    {
                        "kind": "training",
                        "world_size": placement.world_size,
                        "placement": [[placement.rank, placement.node, placement.gpu or ""]],
                        **declared,
                        **own_pod(os.environ),  # team and pod_uid from the pod's downward API
                    },
                )
            )
        self.shipper = Shipper(
            placement,
            self.queues,
            self.sender,
            self.goodput,
            heartbeat_data=self._heartbeat_data,
            samplers=samplers,
            current_step=self.current_step,
            counters=self.counters,
            flush_interval=flush_interval,
            heartbeat_interval=heartbeat_interval,
        )
        self.shipper.start()
        atexit.register(self._at_exit)
        self.last_words_timeout = last_words_timeout
        self.lastwords = LastWords(self._died)
        if last_words:
            self.lastwords.install()

    # -- the hot path --------------------------------------------------------------------------

    def log(self, step: int, **metrics: float) -> None:
        """Report metrics of ``step`` (loss=..., grad_norm=..., any snake_case name). Never blocks."""
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        q = self.queues
        if len(q.records) < q.capacity:
            q.records.append((_time(), step, metrics))
        else:
            q.dropped_records += 1
        if step > self._logged:
            self._logged = step
            if self._first_step:
                self._first_step = False
                self.goodput.first_step(_time())

    def step(
        self,
        step: int | None = None,
        *,
        tokens: float | None = None,
        samples: float | None = None,
        flops: float | None = None,
    ) -> StepTimer:
        """Time a step (default: the one after the last): ``with run.step(tokens=4096): ...``."""
        if step is None:
            step = max(self._step, self._logged) + 1
        elif type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        return StepTimer(self, step, tokens, samples, flops)

    def current_step(self) -> int:
        """The step in progress, or the last one reported."""
        return max(self._step, self._logged)

    def data_wait(self) -> _Timed:
        """``with run.data_wait(): batch = next(it)``: input waits count as badput, not step time."""
        return _Timed(self, "data_wait")

    def restore(self) -> _Timed:
        """``with run.restore(): model.load_state_dict(...)``: restore time counts as badput."""
        return _Timed(self, "restore")

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, step: int, path: str | os.PathLike[str]) -> CheckpointScope:
        """``with run.checkpoint(step, path): torch.save(...)``: start, end, size and manifest."""
        return CheckpointScope(self.checkpoints, step, Path(path))

    def save(self, *args: Any, step: int | None = None) -> CheckpointScope:
        """``run.save(step, obj, path)``: ``torch.save(obj, path)`` reported as a checkpoint of ``step``.

        The step comes first, as in ``run.log(step, ...)`` and ``run.checkpoint(step, path)``;
        ``run.save(obj, path, step=step)`` is the same. The old ``run.save(obj, path, step)``
        still works, with a DeprecationWarning.
        """
        import torch

        obj, path, step = _save_arguments(args, step)

        scope = self.checkpoint(step, path)
        with scope:
            torch.save(obj, path)
        return scope

    def dcp_save(
        self, state_dict: dict[str, Any], path: str | os.PathLike[str], step: int
    ) -> CheckpointScope:
        """``torch.distributed.checkpoint.save`` into directory ``path``; each rank hashes its own files."""
        from torch.distributed.checkpoint.state_dict_saver import save

        scope = CheckpointScope(self.checkpoints, step, Path(path), dcp_rank_files(self.placement.rank))
        with scope:
            save(state_dict, checkpoint_id=str(path))
        return scope

    def checkpoint_saved(self, step: int, path: str | os.PathLike[str], seconds: float = 0.0) -> None:
        """A checkpoint someone else saved (a framework's own saving): hash it and report completion."""
        self.checkpoints.saved(step, Path(path), _time() - seconds)

    def verify_checkpoint(self, path: str | os.PathLike[str]) -> Future[list[Verification]]:
        """Re-check ``path``'s manifests in the background; results become ``checkpoint_verified`` events."""
        return self.checkpoints.verify(Path(path))

    # -- collectives, gradients, events --------------------------------------------------------

    def track_collectives(self, group: Any = None, *, grad_norm: bool = False) -> CollectiveTracker:
        """Time collectives (see :mod:`gpuscope.sdk.collectives`); ``gpuscope.init`` already does
        for the first DDP model, so this is for other groups, wrapped collectives or ``grad_norm``."""
        if self._ddp_watch is not None:
            self._ddp_watch.remove()
            self._ddp_watch = None
        if self.collectives is not None and group is None:
            self.collectives.grad_norm = self.collectives.grad_norm or grad_norm
            return self.collectives
        self.collectives = CollectiveTracker(self.queues, self.current_step, group=group, grad_norm=grad_norm)
        return self.collectives

    def watch_collectives(self) -> bool:
        """Install collective timing on the first DDP model to run forward, when torch is in use
        and the job has several ranks; True if watching."""
        if self._ddp_watch is not None or self.collectives is not None:
            return self._ddp_watch is not None
        if "torch" not in sys.modules or self.placement.world_size < 2:
            return False
        self._ddp_watch = DdpWatch(self._watched)
        return True

    def _watched(self) -> CollectiveTracker:
        self._ddp_watch = None
        return self.track_collectives()

    def grad_norm(self, parameters: Iterable[Any], step: int | None = None) -> Any:
        """This rank's gradient norm, reported for ``step`` (default: the current one).

        Returns a tensor: turning it into a number (a device sync on GPU) is left to the SDK's
        thread. Call it before the optimizer step; after DDP's all-reduce all ranks agree, so
        gradient skew across ranks needs ``track_collectives(grad_norm=True)`` instead.
        """
        from gpuscope.sdk.gradients import grad_norm

        value = grad_norm(parameters)
        self.queues.put((_time(), self.current_step() if step is None else step, {"grad_norm": value}))
        return value

    def event(self, kind: str, **data: Any) -> None:
        """Report a typed event with this rank's labels (see :data:`gpuscope.signals.EVENT_KINDS`)."""
        self.queues.event(Event(_time(), kind, self.placement.labels, data))

    def _heartbeat_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dropped_records": self.queues.dropped_records,
            "dropped_events": self.queues.dropped_events,
            "backlog": len(self.sender.spool),
        }
        if self.collectives is not None:
            data.update(self.collectives.state())
        return data

    # -- reporting and the end -----------------------------------------------------------------

    def goodput_report(self) -> GoodputReport:
        return self.goodput.report(_time())

    def stats(self) -> dict[str, int]:
        """Counters of what was shipped, spooled, refused or dropped."""
        out = self.counters.snapshot()
        out["dropped_records"] = self.queues.dropped_records
        out["dropped_events"] = self.queues.dropped_events
        out["backlog"] = len(self.sender.spool)
        return out

    def finish(self, ok: bool = True, reason: str | None = None, timeout: float = 10.0) -> None:
        """Ship what is queued and stop. Rank 0 reports the job ended; any rank may report that it
        failed (``ok=False``, with ``reason``): the hub names the first rank to fail."""
        if ok:
            self.lastwords.speak(_time(), "", {}, lambda ts, _r, _c: self._end(ts, None, {}, timeout))
        else:
            reason = reason or "failed"
            cause = {"cause": "requested"}
            self.lastwords.speak(_time(), reason, cause, lambda ts, r, c: self._end(ts, r, c, timeout))

    def crashed(self, exc: BaseException) -> None:
        """Report that this rank failed with ``exc`` (its type and message), and stop."""
        self.lastwords.speak(_time(), *exception_cause(type(exc), exc))

    def _died(self, ts: float, reason: str, cause: dict[str, Any]) -> None:
        """Last words from an uncaught exception or a terminating signal (see :mod:`.lastwords`)."""
        self._end(ts, reason, cause, self.last_words_timeout)

    def _end(self, ts: float, failure: str | None, cause: dict[str, Any], timeout: float) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        atexit.unregister(self._at_exit)
        if self._ddp_watch is not None:
            self._ddp_watch.remove()
        if self.collectives is not None:
            self.collectives.close()
            # a dying rank may have been interrupted inside the tracker (holding its lock)
            if failure is None:
                self.collectives.finish_step()
        self.checkpoints.close(timeout)
        data: dict[str, Any] = {"goodput": self.goodput_report().metrics()}
        if failure is None:
            if self.placement.rank == 0:
                self.queues.event(Event(ts, "job_ended", {"job": self.placement.job}, data))
        else:
            data.update(cause)
            data["reason"] = failure
            data["step"] = self.current_step()
            self.queues.event(Event(ts, "job_failed", self.placement.labels, data))
        self.shipper.stop(timeout)
        self.sender.close()
        self.sender.spool.close()
        self.lastwords.uninstall()
        dropped = self.queues.dropped_records + self.queues.dropped_events
        if dropped:
            log.warning("gpuscope: %d reports were dropped because the SDK's buffer was full", dropped)

    def _at_exit(self) -> None:
        """The interpreter exits without finish(): ship what is queued, claim nothing about the job."""
        self.lastwords.speak(_time(), "", {}, lambda _ts, _r, _c: self._stop_quietly())

    def _stop_quietly(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
        if self._ddp_watch is not None:
            self._ddp_watch.remove()
        if self.collectives is not None:
            self.collectives.close()
        self.checkpoints.close(5.0)
        self.shipper.stop(5.0)
        self.lastwords.uninstall()

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.finish()
        else:
            self.crashed(exc)
