"""A simulated node read the way a real one is: its GPUs through the real NVML collector.

Each tick the simulator hands over one node's batch. :class:`SimNvmlNode` turns its GPU frame
and its GPU events into the state of a :class:`~gpuscope.collect.fake_nvml.FakeNvml` (through
:mod:`gpuscope.collect.sim_nvml`), so the node's agent reads the GPUs with
:class:`~gpuscope.collect.nvml.NvmlCollector`, calls, event thread and all. Everything NVML would
not see (the node frame, service frames, other events, training records) goes to a
:class:`~gpuscope.collect.simulated.SimulatedNode`. The simulated GPU frame and the events NVML
reports itself (XID, DBE, lost GPU) never go out a second time.

Attribution is the real one too: a GPU the simulator has allocated to a job gets a process in the
fake, and that process gets a directory under this node's own procfs root with ``GPUSCOPE_JOB``
in its environment, which :func:`~gpuscope.collect.attribution.process_owner` reads as on a real
node. A GPU the simulator brings back after a fault (it reappears in the frames) is reset in the
fake (:meth:`FakeNvml.restore`); the collector picks it up again on its own.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Sequence
from pathlib import Path

from gpuscope.collect.base import Collector
from gpuscope.collect.fake_nvml import FakeNvml, FakeProcess
from gpuscope.collect.nvml import NvmlCollector
from gpuscope.collect.nvml_events import EventWatcher
from gpuscope.collect.sim_nvml import NVML_EVENT_KINDS, apply_event, apply_frame
from gpuscope.collect.simulated import SimulatedNode
from gpuscope.counters import Counters
from gpuscope.model import Batch, Frame

#: Event kinds NVML reports through its event set (the others it finds by polling).
THREAD_EVENT_KINDS = frozenset({"xid", "ecc_dbe"})
#: First pid of the processes that stand in for the simulated jobs' ranks.
FIRST_PID = 40_000


def is_gpu_frame(frame: Frame) -> bool:
    """A frame of whole-GPU rows: GPU metrics, every entity a GPU (no link, process or MIG rows).
    A node whose GPUs are all lost sends one with no rows, which is still its GPU frame."""
    return "gpu_utilization_percent" in frame.metrics and all(
        "gpu" in e and not {"link", "pid", "mig"} & e.keys() for e in frame.entities
    )


class SimNvmlNode:
    """One simulated node: feed it each tick's batch; its agent runs :attr:`collectors`.

    Counters: ``gpus_lost``, ``gpus_restored``, ``events_to_nvml``, ``events_passed_on``,
    ``nvml_events_late`` (the event thread had not passed an event on within ``event_wait``
    seconds: it arrives a round later).
    """

    def __init__(
        self,
        node: str,
        gpus: int,
        proc_root: str | Path,
        *,
        uuids: Sequence[str] | None = None,
        slow_every: int = 5,
        event_wait: float = 2.0,
    ) -> None:
        if gpus < 1:
            raise ValueError(f"a simulated node needs at least one GPU, got {gpus}")
        if uuids is not None and len(uuids) != gpus:
            raise ValueError(f"{node}: {len(uuids)} GPU UUIDs for {gpus} GPUs")
        self.node = node
        self.fake = FakeNvml.healthy(gpus)
        for gpu, uuid in zip(self.fake.gpus, uuids or (), strict=False):
            gpu.uuid = uuid  # the simulator's UUIDs, so rows match what it reports elsewhere
        self.proc_root = Path(proc_root)
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.event_wait = event_wait
        self.counters = Counters()
        self.nvml = NvmlCollector(node, lib=self.fake, proc_root=str(self.proc_root), slow_every=slow_every)
        self.rest = SimulatedNode(node)
        self._now = 0.0
        self._last_gpu_ts: float | None = None
        self._pids = itertools.count(FIRST_PID)
        self._jobs: dict[int, tuple[str, int]] = {}  # GPU index -> (job, pid of its process)
        # The event thread starts now, before any fault, and stamps events with the simulated
        # time of the latest batch (the collector would start it on its first round, on the wall
        # clock).
        self.nvml.watcher = EventWatcher(
            self.nvml.session, self.nvml.session.open(), self.nvml.labels, clock=lambda: self._now
        )

    @property
    def collectors(self) -> list[Collector]:
        """What this node's agent runs: the NVML collector, then the simulated rest."""
        return [self.nvml, self.rest]

    def feed(self, batch: Batch) -> None:
        """Apply one tick's batch: GPU state into the fake NVML, the rest to the simulated collector."""
        gpu_frames = [f for f in batch.frames if is_gpu_frame(f)]
        others = [f for f in batch.frames if not is_gpu_frame(f)]
        if gpu_frames:
            self._now = max(f.ts for f in gpu_frames)
            self._presence(gpu_frames)
        posted = 0
        passed_on = []
        for event in batch.events:
            if event.kind in NVML_EVENT_KINDS and apply_event(self.fake, event):
                self.counters.inc("events_to_nvml")
                posted += event.kind in THREAD_EVENT_KINDS
            else:
                passed_on.append(event)
        self.counters.inc("events_passed_on", len(passed_on))
        for frame in gpu_frames:
            dt = None if self._last_gpu_ts is None else frame.ts - self._last_gpu_ts
            apply_frame(self.fake, frame, dt=dt)
            self._attribute(frame)
            self._last_gpu_ts = frame.ts
        self.rest.feed(
            Batch(
                source=batch.source,
                frames=others,
                events=passed_on,
                training=batch.training,
                batch_id=batch.batch_id,
            )
        )
        if posted and not self.fake.wait_events_taken(self.event_wait):
            self.counters.inc("nvml_events_late")

    def _presence(self, frames: list[Frame]) -> None:
        """A GPU absent from the node's GPU rows is lost to NVML; one that is back was reset."""
        present = {int(e["gpu"]) for f in frames for e in f.entities if e["gpu"].isdigit()}
        for i, gpu in enumerate(self.fake.gpus):
            if i in present and gpu.lost:
                self.fake.restore(i)
                self._release(i)  # the reset ended its processes
                self.counters.inc("gpus_restored")
            elif i not in present and not gpu.lost:
                self.fake.lose(i)
                self.counters.inc("gpus_lost")

    def _attribute(self, frame: Frame) -> None:
        """Give each allocated GPU one process of its job; a GPU whose job ended loses it."""
        for labels in frame.entities:
            if not labels["gpu"].isdigit() or int(labels["gpu"]) >= len(self.fake.gpus):
                continue
            i, job = int(labels["gpu"]), labels.get("job")
            held = self._jobs.get(i)
            if held is not None and held[0] != job:
                self._release(i)
                held = None
            if job is None:
                continue
            gpu = self.fake.gpus[i]
            if held is None:
                pid = next(self._pids)
                self._write_process(pid, job)
                self._jobs[i] = (job, pid)
                gpu.processes[:] = [FakeProcess(pid, gpu.used)]
            else:
                for p in gpu.processes:
                    p.used_bytes = gpu.used

    def _write_process(self, pid: int, job: str) -> None:
        """``<proc_root>/<pid>/environ`` as the kernel shows it: NUL-separated ``KEY=value``."""
        d = self.proc_root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "environ").write_bytes(f"GPUSCOPE_JOB={job}\0".encode())

    def _release(self, index: int) -> None:
        held = self._jobs.pop(index, None)
        self.fake.gpus[index].processes.clear()
        if held is not None:
            shutil.rmtree(self.proc_root / str(held[1]), ignore_errors=True)

    def close(self) -> None:
        """Stop the collectors (the agent does this too when it owns them; twice is harmless)."""
        for collector in self.collectors:
            collector.close()
