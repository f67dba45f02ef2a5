"""Timing of ``torch.distributed`` collectives: who arrived when, who waited, who never came.

A collective's duration mostly measures waiting for the slowest rank, so it blames the wrong
ones. What names the late rank is *arrival*: each rank measures the gap from the end of its
previous collective to its arrival at the next one (collectives end together on every rank, so
the gap needs no synchronised clocks) and reports it once per step as
``collective_arrival_gap_seconds``, with ``collective_wait_seconds``. The ranks never exchange
anything for it: the hub lines the ranks' gaps of a step up and names the one beyond the peer
median, so the training loop gains no collective. Heartbeats carry how many collectives the rank
entered and how long it has been waiting, so when a job hangs the hub can name the rank that
never arrived.

``gpuscope.init`` installs it by itself on the first ``DistributedDataParallel`` model that runs
forward (:class:`DdpWatch`, :meth:`CollectiveTracker.watch`): arrival is when the model's first
gradient is ready (DDP's first bucket holds the last parameters), the end of the step's
collectives is the optimizer's step (it starts when DDP's backward has waited for them). Two
Python calls per step on the training thread, none on the communication thread. For exact
per-collective timing (and each rank's own gradient norm), ``tracker.install(ddp_model)``
registers a DDP communication hook instead (dearer: a Python call and a callback per bucket), or
call the wrapped collectives (``tracker.all_reduce(t)``) in place of ``torch.distributed``'s.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuscope.sdk.shipper import Queues

log = logging.getLogger("gpuscope.sdk.collectives")

GAP = "collective_arrival_gap_seconds"
WAIT = "collective_wait_seconds"
LOCAL_GRAD_NORM = "grad_norm"


_TRACKED = "_gpuscope_collectives"


def _torch() -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gpuscope collectives need torch.distributed initialised first (init_process_group)"
        )
    return torch, dist


class CollectiveTracker:
    """Times collectives of one process group for one run."""

    def __init__(
        self, queues: Queues, current_step: Callable[[], int], *, group: Any = None, grad_norm: bool = False
    ) -> None:
        self.torch, self.dist = _torch()
        self.queues = queues
        self.current_step = current_step
        self.group = group
        self.world = int(self.dist.get_world_size(group))
        self.rank = int(self.dist.get_rank(group))
        self.grad_norm = grad_norm
        self._lock = threading.Lock()
        self.seq = 0  # collectives entered
        self._pending: dict[int, tuple[float, str]] = {}  # seq -> (arrival, name)
        self._last_done: float | None = None
        self._step_seen = -1
        self._closed = -1  # the step whose wait was reported (as soon as its collectives ended)
        self._step_wait = 0.0
        self._norms: list[Any] = []
        self._open: tuple[int, float] | None = None  # watch(): the arrival the optimizer will close
        self._handles: list[Any] = []

    # -- bookkeeping ---------------------------------------------------------------------------

    def _arrive(self, name: str) -> tuple[int, float]:
        now = time.monotonic()
        step = self.current_step()
        with self._lock:
            self.seq += 1
            seq = self.seq
            self._pending[seq] = (now, name)
            new_step = step != self._step_seen
            previous, self._step_seen = self._step_seen, step
            last_done = self._last_done
        if new_step:
            self._close_step(previous)
            if last_done is not None:
                self.queues.put((time.time(), step, {GAP: now - last_done}))
        return seq, now

    def _done(self, seq: int, arrived: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._pending.pop(seq, None)
            self._last_done = now if self._last_done is None else max(self._last_done, now)
            self._step_wait += now - arrived

    def _close_step(self, step: int) -> None:
        """The step's collectives are over: report its total wait (and local grad norm), once."""
        with self._lock:
            if step == self._closed:
                return
            self._closed = step
            wait, self._step_wait = self._step_wait, 0.0
            norms, self._norms = self._norms, []
        if step < 0:
            return
        metrics: dict[str, Any] = {WAIT: wait}
        if norms:
            # a tensor: the SDK thread turns it into a number, so the training thread never syncs
            metrics[LOCAL_GRAD_NORM] = self.torch.linalg.vector_norm(self.torch.stack(norms))
        self.queues.put((time.time(), step, metrics))

    def state(self) -> dict[str, Any]:
        """What the heartbeat carries: collectives entered, and how long the oldest open one waits."""
        now = time.monotonic()
        with self._lock:
            seq = self.seq
            oldest = min(self._pending.values(), default=None)
        out: dict[str, Any] = {"collective_seq": seq, "collective_waiting_seconds": 0.0}
        if oldest is not None:
            out["collective_waiting_seconds"] = round(now - oldest[0], 3)
            out["collective"] = oldest[1]
        return out

    # -- wrapped collectives -------------------------------------------------------------------

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one ``torch.distributed`` collective, timing arrival and completion."""
        seq, arrived = self._arrive(name)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            self._done(seq, arrived)
            raise
        if kwargs.get("async_op") and result is not None:
            result.get_future().then(lambda _: self._done(seq, arrived))
        else:
            self._done(seq, arrived)
        return result

    def all_reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call("all_reduce", self.dist.all_reduce, tensor, *args, **kwargs)

    def broadcast(self, tensor: Any, src: int, *args: Any, **kwargs: Any) -> Any:
        return self.call("broadcast", self.dist.broadcast, tensor, src, *args, **kwargs)

    def all_gather(self, tensor_list: list[Any], tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call("all_gather", self.dist.all_gather, tensor_list, tensor, *args, **kwargs)

    def reduce_scatter_tensor(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call("reduce_scatter", self.dist.reduce_scatter_tensor, output, input, *args, **kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        return self.call("barrier", self.dist.barrier, *args, **kwargs)

    # -- DDP -----------------------------------------------------------------------------------

    def install(self, ddp_model: Any) -> None:
        """Register :meth:`comm_hook` on a ``DistributedDataParallel`` model (once per model)."""
        if getattr(ddp_model, _TRACKED, False):
            return
        # DDP inspects the hook's annotations (it wants torch's own types); a lambda has none
        ddp_model.register_comm_hook(None, lambda state, bucket: self.comm_hook(state, bucket))
        setattr(ddp_model, _TRACKED, True)

    def watch(self, ddp_model: Any) -> None:
        """Time arrival from the first gradient ready to the optimizer's step (see the module doc)."""
        if getattr(ddp_model, _TRACKED, False):
            return
        params = [p for p in ddp_model.parameters() if p.requires_grad]
        if not params:
            return
        optimizer = sys.modules["torch.optim.optimizer"]
        self._handles.append(params[-1].register_post_accumulate_grad_hook(self._grad_ready))
        self._handles.append(optimizer.register_optimizer_step_pre_hook(self._optimizer_step))
        setattr(ddp_model, _TRACKED, True)

    def _grad_ready(self, _param: Any) -> None:
        if self._open is None:
            self._open = self._arrive("ddp_backward")

    def _optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            self._done(*opened)
            # reported now, so the step's record is whole before whatever follows (a checkpoint)
            self._close_step(self._step_seen)

    def close(self) -> None:
        """Remove the hooks :meth:`watch` installed (the optimizer's is global)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def comm_hook(self, _state: Any, bucket: Any) -> Any:
        """DDP's default all-reduce (average), with arrival, wait and local gradient norm recorded."""
        buffer = bucket.buffer()
        seq, arrived = self._arrive("ddp_all_reduce")
        if self.grad_norm:  # before averaging: this rank's own gradients, which is what skew needs
            norm = self.torch.linalg.vector_norm(buffer.detach())
            with self._lock:
                self._norms.append(norm)
        buffer.div_(self.world)
        future = self.dist.all_reduce(buffer, group=self.group, async_op=True).get_future()
        last = bucket.is_last()

        def reduced(fut: Any) -> Any:
            self._done(seq, arrived)
            if last:  # the step's collectives are over: its record is whole before what follows
                self._close_step(self._step_seen)
            return fut.value()[0]

        return future.then(reduced)

    def finish_step(self) -> None:
        """Report the last step's wait (the next step's first collective would otherwise)."""
        with self._lock:
            step, self._step_seen = self._step_seen, -1
        self._close_step(step)


class DdpWatch:
    """Installs collective timing on the first ``DistributedDataParallel`` model that runs forward.

    A global forward pre-hook sees every module until then, and removes itself at the first DDP
    model (a module with a reducer and ``register_comm_hook``), or after ``patience`` other module
    calls, so later steps pay nothing.
    """

    def __init__(self, tracker: Callable[[], CollectiveTracker], patience: int = 10_000) -> None:
        self._tracker = tracker
        # a job without DDP (FSDP, pipelines) must not pay a Python call per module for ever
        self._patience = patience
        torch = sys.modules["torch"]
        self._handle: Any = torch.nn.modules.module.register_module_forward_pre_hook(self._pre)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre(self, module: Any, _args: Any) -> None:
        if not (hasattr(module, "register_comm_hook") and hasattr(module, "reducer")):
            self._patience -= 1
            if self._patience <= 0:
                self.remove()
            return
        self.remove()
        try:
            self._tracker().watch(module)
        except RuntimeError as exc:  # no process group after all
            log.info("gpuscope: collective timing not installed on %s: %s", type(module).__name__, exc)
