"""The exits of a node's training ranks: a ``process_exited`` event per rank process that ends.

A rank that is SIGKILLed (the out-of-memory killer, an operator, a scheduler) says nothing; the
agent beside it sees it go, with its signal or exit code and the time, where the kernel's
process-event connector can be opened (:mod:`gpuscope.collect.procexit`), and at least that it
went otherwise. A rank process is one whose environment names a job (the key the SDK uses,
:func:`gpuscope.collect.attribution.process_owner`) and a rank; its children that inherited both
(data-loader workers) are not watched: the rank is the oldest process of its (job, rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuscope.collect.attribution import process_owner
from gpuscope.collect.base import Collected, Collector, register_collector
from gpuscope.collect.procexit import ExitWatcher, open_exit_watcher, stat_fields
from gpuscope.model import Event


@dataclass(frozen=True, slots=True)
class _Rank:
    job: str
    rank: str


@register_collector
class JobProcessCollector(Collector):
    name = "jobprocs"
    default = True

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        watcher: ExitWatcher | None = None,
        max_pids: int = 65536,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self.watcher = watcher if watcher is not None else open_exit_watcher(proc_root)
        self.max_pids = max_pids
        self._seen: dict[int, _Rank | None] = {}  # pid -> its rank, None when not a rank process
        self._watched: dict[int, _Rank] = {}

    def collect(self, now: float) -> Collected:
        self._scan()
        out = Collected()
        for ended in self.watcher.exits(list(self._watched), now):
            who = self._watched.pop(ended.pid, None)
            if who is None:
                continue
            data: dict[str, object] = {"pid": ended.pid, "source": self.watcher.source}
            if ended.exit_code is not None:
                data["exit_code"] = ended.exit_code
            if ended.signal is not None:
                data["signal"] = ended.signal
            data["reason"] = ended.describe()
            labels = {"job": who.job, "rank": who.rank, "node": self.node}
            out.events.append(Event(ended.ts, "process_exited", labels, data))
        return out

    def _scan(self) -> None:
        try:
            pids = {int(name) for name in os.listdir(self.proc_root) if name.isdecimal()}
        except OSError:
            return
        for pid in [p for p in self._seen if p not in pids]:
            del self._seen[pid]  # gone: a reused pid is looked at afresh
        for pid in sorted(pids - self._seen.keys()):
            if len(self._seen) >= self.max_pids:
                break
            owner = process_owner(pid, self.proc_root)
            rank = _Rank(owner.job, owner.rank) if owner.job and owner.rank is not None else None
            self._seen[pid] = rank
            if rank is not None and self._watched_parent(pid) != rank:
                self._watched[pid] = rank

    def _watched_parent(self, pid: int) -> _Rank | None:
        fields = stat_fields(self.proc_root, pid) or []
        parent = int(fields[1]) if len(fields) > 1 and fields[1].isdecimal() else -1
        return self._seen.get(parent)

    def close(self) -> None:
        self.watcher.close()
