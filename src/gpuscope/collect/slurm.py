"""The Slurm scheduler's view: the ``slurm`` collector (``gpuscope agent --slurm``).

Runs ``squeue --json`` (queued, pending with reason, running, and the failed jobs Slurm keeps for
``MinJobAge``) and ``sinfo --json`` (node states), on one node of the cluster (the controller or a
login node). Per round:

* ``job_failed`` events for jobs Slurm ended as FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY,
  BOOT_FAIL or DEADLINE (reason, exit code), once per job, whether or not the job used the SDK.
  The job label is the Slurm job id, as the agent and SDK name it (:mod:`gpuscope.identity`);
* a row per pending job (``slurm_job_pending_seconds``, GPUs asked for) and per running job (the
  queue wait it had), labelled ``partition`` and ``job_id``: the input of ``job_pending_too_long``;
* per partition: jobs and GPUs pending (demand), running, total and unavailable (capacity), for
  capacity planning history;
* per node: ``slurm_node_unavailable`` (down, drained or draining) and its GPUs, so drained
  nodes count as down GPU time.

Both JSON shapes are read: Slurm 22.05's (``openapi/v0.0.38``: plain numbers, a state string, the
exit code as a wait status) and 23.02+'s (``{"set", "number"}`` numbers, state lists, an exit code
object). Fields from SchedMD/slurm src/plugins/openapi/v0.0.38 and data_parser/v0.0.40 (captured
from Debian's slurm-wlm 22.05.8 in tests/collect/fixtures/slurm). A failed command is an error for
that round; nothing is guessed.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from gpuscope.collect.base import Collected, Collector, CollectorContext, CollectorError, register_collector
from gpuscope.collect.nvml import frame
from gpuscope.model import Event, Labels
from gpuscope.signals import SCHEDULER_METRICS

#: job states that mean the job failed (squeue's job_state; sacct's state)
FAILED_STATES = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
#: node states and flags that take a node out of service
UNAVAILABLE = frozenset(
    {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "MAINTENANCE"}
)
_GPU_TRES = re.compile(r"gres[:/]gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")

Runner = Callable[[list[str]], str]


def number(value: Any) -> float | None:
    """A Slurm JSON number: plain (22.05) or ``{"set": true, "infinite": false, "number": n}``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping) and value.get("set", True) and not value.get("infinite", False):
        return number(value.get("number"))
    return None


def states(value: Any) -> list[str]:
    """A state as a list of upper-case words: ``"PENDING"`` or ``["PENDING"]`` or ``"idle"``."""
    if isinstance(value, str):
        return [value.upper()] if value else []
    if isinstance(value, list):
        return [str(v).upper() for v in value if isinstance(v, str)]
    return []


def exit_code(value: Any) -> tuple[int | None, int | None]:
    """(return code, signal) from a 22.05 wait status or a 23.02+ exit-code object."""
    if isinstance(value, Mapping):
        rc = number(value.get("return_code"))
        sig = value.get("signal")
        signo = number(sig.get("id")) if isinstance(sig, Mapping) else None
        return (None if rc is None else int(rc)), (None if not signo else int(signo))
    raw = number(value)
    if raw is None:
        return None, None
    status = int(raw)
    return (status >> 8) & 0xFF, (status & 0x7F) or None


def gpus_of_job(job: Mapping[str, Any]) -> int:
    """GPUs a job asks for: per node times nodes, or per job."""
    nodes = number(job.get("node_count")) or 1.0
    for key, per_node in (("tres_per_node", True), ("tres_per_job", False), ("tres_req_str", False)):
        text = job.get(key)
        if isinstance(text, str) and (m := _GPU_TRES.search(text)):
            return int(m.group(1)) * (int(nodes) if per_node else 1)
    return 0


def gpus_of_node(node: Mapping[str, Any]) -> int:
    text = node.get("gres")
    if isinstance(text, str):
        return sum(int(m.group(1)) for m in _GPU_GRES.finditer(text))
    return 0


@dataclass(slots=True)
class SlurmJob:
    job_id: str
    name: str
    partition: str
    state: str
    reason: str
    submit: float | None
    start: float | None
    end: float | None
    gpus: int
    exit_code: int | None = None
    signal: int | None = None
    array_job_id: str | None = None
    restarts: int = 0


def parse_jobs(doc: Mapping[str, Any]) -> list[SlurmJob]:
    """The jobs of ``squeue --json``; a job without an id is skipped."""
    out: list[SlurmJob] = []
    for j in doc.get("jobs", []) or []:
        if not isinstance(j, Mapping):
            continue
        jid = number(j.get("job_id"))
        if jid is None:
            continue
        st = states(j.get("job_state"))
        rc, sig = exit_code(j.get("exit_code"))
        array = number(j.get("array_job_id"))
        out.append(
            SlurmJob(
                job_id=str(int(jid)),
                name=str(j.get("name") or ""),
                partition=str(j.get("partition") or ""),
                state=st[0] if st else "",
                reason=str(j.get("state_reason") or ""),
                submit=number(j.get("submit_time")) or None,
                start=number(j.get("start_time")) or None,
                end=number(j.get("end_time")) or None,
                gpus=gpus_of_job(j),
                exit_code=rc,
                signal=sig,
                array_job_id=str(int(array)) if array else None,
                restarts=int(number(j.get("restart_cnt")) or 0),
            )
        )
    return out


@dataclass(slots=True)
class SlurmNode:
    name: str
    states: list[str]
    partitions: list[str]
    gpus: int
    reason: str

    @property
    def unavailable(self) -> bool:
        return any(s in UNAVAILABLE for s in self.states)


def parse_nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """The nodes of ``sinfo --json``: states and flags together (22.05 splits them)."""
    out: list[SlurmNode] = []
    for n in doc.get("nodes", []) or []:
        if not isinstance(n, Mapping) or not n.get("name"):
            continue
        parts = n.get("partitions")
        out.append(
            SlurmNode(
                name=str(n["name"]),
                states=states(n.get("state")) + states(n.get("state_flags")),
                partitions=[str(p) for p in parts] if isinstance(parts, list) else [],
                gpus=gpus_of_node(n),
                reason=str(n.get("reason") or ""),
            )
        )
    return out


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


@dataclass(slots=True)
class _Partition:
    pending: int = 0
    running: int = 0
    gpus_pending: int = 0
    gpus_running: int = 0
    gpus_total: int = 0
    gpus_unavailable: int = 0
    oldest_pending: float = 0.0


@register_collector
class SlurmCollector(Collector):
    """Jobs, queue and node states from the Slurm controller."""

    name = "slurm"
    enabled_by = ("slurm",)

    def __init__(
        self,
        node: str,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        run: Runner | None = None,
        cluster: str | None = None,
    ) -> None:
        super().__init__(node, proc_root=proc_root, sys_root=sys_root)
        self._run = run or _run
        self.cluster = cluster
        self._failed_seen: set[str] = set()

    @classmethod
    def from_context(cls, ctx: CollectorContext) -> Self:
        return cls(ctx.node, proc_root=ctx.proc_root, sys_root=ctx.sys_root)

    def _json(self, argv: list[str], out: Collected) -> Mapping[str, Any] | None:
        try:
            doc = json.loads(self._run(argv))
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            out.errors.append(CollectorError("slurm_command", str(exc)))
            return None
        except ValueError as exc:
            out.errors.append(CollectorError("slurm_format", f"{argv[0]} --json: {exc}"))
            return None
        if not isinstance(doc, Mapping):
            out.errors.append(CollectorError("slurm_format", f"{argv[0]} --json: not an object"))
            return None
        return doc

    def _labels(self, **labels: str) -> Labels:
        return {**labels, "cluster": self.cluster} if self.cluster else dict(labels)

    def collect(self, now: float) -> Collected:
        out = Collected()
        jobs_doc = self._json(["squeue", "--json"], out)
        nodes_doc = self._json(["sinfo", "--json"], out)
        if jobs_doc is None and nodes_doc is None:
            raise RuntimeError("; ".join(e.message for e in out.errors))
        parts: dict[str, _Partition] = {}
        job_rows: list[tuple[Labels, dict[str, float]]] = []
        for job in parse_jobs(jobs_doc or {}):
            p = parts.setdefault(job.partition, _Partition())
            labels = self._labels(partition=job.partition, job_id=job.job_id)
            if job.state == "PENDING":
                waited = max(0.0, now - job.submit) if job.submit else 0.0
                p.pending += 1
                p.gpus_pending += job.gpus
                p.oldest_pending = max(p.oldest_pending, waited)
                job_rows.append(
                    (
                        {**labels, "reason": job.reason},
                        {"slurm_job_pending_seconds": waited, "slurm_job_gpus": job.gpus},
                    )
                )
            elif job.state == "RUNNING":
                p.running += 1
                p.gpus_running += job.gpus
                row = {"slurm_job_gpus": float(job.gpus)}
                if job.start and job.submit:
                    row["slurm_job_queue_wait_seconds"] = max(0.0, job.start - job.submit)
                job_rows.append((labels, row))
            elif job.state in FAILED_STATES and job.job_id not in self._failed_seen:
                self._failed_seen.add(job.job_id)
                out.events.append(self._failed(job, now))
        node_rows: list[tuple[Labels, dict[str, float]]] = []
        for n in parse_nodes(nodes_doc or {}):
            node_rows.append(
                (
                    self._labels(node=n.name),
                    {
                        "slurm_node_unavailable": 1.0 if n.unavailable else 0.0,
                        "slurm_node_gpus": float(n.gpus),
                    },
                )
            )
            for name in n.partitions:
                p = parts.setdefault(name, _Partition())
                p.gpus_total += n.gpus
                p.gpus_unavailable += n.gpus if n.unavailable else 0
        part_rows = [
            (
                self._labels(partition=name),
                {
                    "slurm_jobs_pending": float(p.pending),
                    "slurm_jobs_running": float(p.running),
                    "slurm_gpus_pending": float(p.gpus_pending),
                    "slurm_gpus_running": float(p.gpus_running),
                    "slurm_gpus_total": float(p.gpus_total),
                    "slurm_gpus_unavailable": float(p.gpus_unavailable),
                    "slurm_oldest_pending_seconds": p.oldest_pending,
                },
            )
            for name, p in sorted(parts.items())
        ]
        for rows in (part_rows, job_rows, node_rows):
            f = frame(now, SCHEDULER_METRICS, rows)
            if f is not None:
                out.frames.append(f)
        return out

    def _failed(self, job: SlurmJob, now: float) -> Event:
        data: dict[str, Any] = {
            "reason": job.reason if job.reason and job.reason != "None" else job.state,
            "state": job.state,
            "partition": job.partition,
            "source": "slurm",
            "restarts": job.restarts,
        }
        if job.exit_code is not None:
            data["exit_code"] = job.exit_code
        if job.signal is not None:
            data["signal"] = job.signal
        if job.array_job_id:
            data["array_job_id"] = job.array_job_id
        labels = self._labels(job=job.job_id)
        return Event(job.end or now, "job_failed", labels, data)
