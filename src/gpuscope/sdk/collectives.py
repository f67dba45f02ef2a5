"""Opt-in timing of ``torch.distributed`` collectives: who arrived when, who waited, who never came.

A collective's duration mostly measures waiting for the slowest rank, so it blames the wrong
ones. What names the late rank is *arrival*: each rank measures the gap from the end of its
previous collective to its arrival at the next one (collectives end together on every rank, so
the gap needs no synchronised clocks), and once per step the ranks exchange these gaps
asynchronously over a small side gloo group. Each rank then reports
``collective_arrival_skew_seconds`` (its gap minus the smallest), ``collective_late_rank`` and
``collective_wait_seconds`` for the step. Heartbeats carry how many collectives the rank entered
and how long it has been waiting, so when a job hangs the hub can name the rank that never
arrived.

Use it with DDP as a communication hook (``tracker.install(ddp_model)``), or call the wrapped
collectives (``tracker.all_reduce(t)``) in place of ``torch.distributed``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuscope.sdk.shipper import Queues

log = logging.getLogger("gpuscope.sdk.collectives")

SKEW = "collective_arrival_skew_seconds"
LATE_RANK = "collective_late_rank"
MAX_SKEW = "collective_max_skew_seconds"
WAIT = "collective_wait_seconds"
LOCAL_GRAD_NORM = "grad_norm"


def _torch() -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gpuscope collectives need torch.distributed initialised first (init_process_group)"
        )
    return torch, dist


class CollectiveTracker:
    """Times collectives of one process group for one run; construct it on every rank at once."""

    def __init__(
        self,
        queues: Queues,
        current_step: Callable[[], int],
        *,
        group: Any = None,
        exchange: bool = True,
        grad_norm: bool = False,
    ) -> None:
        self.torch, self.dist = _torch()
        self.queues = queues
        self.current_step = current_step
        self.group = group
        self.world = int(self.dist.get_world_size(group))
        self.rank = int(self.dist.get_rank(group))
        # a side group keeps the tiny exchange off the user's (maybe NCCL) communicator; creating
        # it is itself collective, which is why every rank constructs the tracker together
        self.side = self.dist.new_group(backend="gloo") if exchange and self.world > 1 else None
        self.grad_norm = grad_norm
        self._lock = threading.Lock()
        self.seq = 0  # collectives entered
        self._pending: dict[int, tuple[float, str]] = {}  # seq -> (arrival, name)
        self._last_done: float | None = None
        self._step_seen = -1
        self._step_wait = 0.0
        self._norms: list[Any] = []
        self.exchanges_failed = 0

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
            if self.side is not None and last_done is not None:
                self._exchange(step, now - last_done)
        return seq, now

    def _done(self, seq: int, arrived: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._pending.pop(seq, None)
            self._last_done = now if self._last_done is None else max(self._last_done, now)
            self._step_wait += now - arrived

    def _close_step(self, step: int) -> None:
        """The previous step's collectives are over: report its total wait (and local grad norm)."""
        with self._lock:
            wait, self._step_wait = self._step_wait, 0.0
            norms, self._norms = self._norms, []
        if step < 0:
            return
        metrics: dict[str, Any] = {WAIT: wait}
        if norms:
            # a tensor: the SDK thread turns it into a number, so the training thread never syncs
            metrics[LOCAL_GRAD_NORM] = self.torch.linalg.vector_norm(self.torch.stack(norms))
        self.queues.put((time.time(), step, metrics))

    def _exchange(self, step: int, gap: float) -> None:
        torch = self.torch
        mine = torch.tensor([gap], dtype=torch.float64)
        gaps = [torch.empty(1, dtype=torch.float64) for _ in range(self.world)]
        try:
            work = self.dist.all_gather(gaps, mine, group=self.side, async_op=True)
        except RuntimeError as exc:
            self._exchange_failed(exc)
            return

        def arrived(_: Any) -> None:
            try:
                values = [float(g.item()) for g in gaps]
                first = min(values)
                late = max(range(self.world), key=values.__getitem__)
                self.queues.put(
                    (
                        time.time(),
                        step,
                        {SKEW: gap - first, LATE_RANK: float(late), MAX_SKEW: values[late] - first},
                    )
                )
            except Exception as exc:  # runs on the communication thread: never raise there
                self._exchange_failed(exc)

        work.get_future().then(arrived)

    def _exchange_failed(self, exc: BaseException) -> None:
        self.exchanges_failed += 1
        if self.exchanges_failed == 1:
            log.warning("gpuscope: arrival exchange failed (%s); skew not reported for that step", exc)

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
        """Register :meth:`comm_hook` on a ``DistributedDataParallel`` model."""
        # DDP inspects the hook's annotations (it wants torch's own types); a lambda has none
        ddp_model.register_comm_hook(None, lambda state, bucket: self.comm_hook(state, bucket))

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

        def reduced(fut: Any) -> Any:
            self._done(seq, arrived)
            return fut.value()[0]

        return future.then(reduced)

    def finish_step(self) -> None:
        """Report the last step's wait (the next step's first collective would otherwise)."""
        with self._lock:
            step, self._step_seen = self._step_seen, -1
        self._close_step(step)
