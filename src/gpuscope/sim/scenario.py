"""Scenario files (DESIGN §4): a cluster, its workloads and the faults injected into it.

The format is the contract of DESIGN §4; every field is checked and every error names the file,
the line and the field (``bad.yaml:12: faults[3].target.gpu: 9 is out of range 0..7``).

Top level: ``seed`` (int, default 0), ``duration`` (simulated seconds, required), ``interval``
(sampling period, default 1), ``cluster``, ``jobs``, ``faults``, and optional ``name`` and
``description``.

``cluster``: ``nodes`` (required), ``gpus_per_node`` (default 8), ``gpu_model`` (one of
:data:`gpuscope.sim.hardware.GPU_MODELS`, default H100-SXM5-80GB), ``price_per_gpu_hour``.

Every job: ``name``, ``kind`` (training | inference), ``nodes``, optional ``gpus`` (indices used
on each node, default all), ``start`` and ``end`` (simulated seconds; default the whole run).

Training jobs: ``step_time`` (seconds, default 1), ``checkpoint_every`` (seconds, default 600;
0 turns checkpoints off), and these optional fields of our own: ``checkpoint_seconds`` (pause of
one save, default 25, kept within 10-60 s by noise), ``steps`` (the job ends normally after that
many steps), ``batch_tokens`` (global tokens per step, default 1,048,576), ``seq_len`` (default
4096), ``learning_rate`` (peak, default 3e-4), ``warmup_steps`` (default 100), ``lr_decay_at``
(fraction of the expected steps where the learning rate steps down by 3x, default 0.5),
``initial_loss`` / ``final_loss`` (defaults 10.8 / 2.1), ``memory_fraction`` (share of GPU
memory the job holds, default 0.82), ``collective_timeout`` (seconds the surviving ranks wait in
a collective for a dead peer before the job fails, like NCCL's watchdog; default 600).

Inference jobs (the job's name is the service's name): ``rps`` (mean requests per second,
default 10), ``model`` (default the job's name), ``version`` (default v1), and optional
``capacity_rps`` (requests per second the service sustains, default 1.8x the diurnal peak),
``latency_seconds`` (median end-to-end latency at light load, default 0.9), ``ttft_seconds``
(default 0.12), ``diurnal_amplitude`` (default 0.35), ``peak_at`` (simulated second of the daily
peak, default 50,400: the run starts at midnight, the peak is at 14:00), ``error_rate`` (base
fraction of failing requests, default 0.001), ``memory_fraction`` (default 0.9, as vLLM).

Every fault: ``at``, ``kind``, ``target``, optional ``params`` (defaults in
:data:`gpuscope.sim.kinds.FAULT_KINDS`), ``duration`` (default: until the end) and ``note``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscope.sim.builtin import builtin_names, builtin_scenario
from gpuscope.sim.hardware import GPU_MODELS, GpuModel
from gpuscope.sim.kinds import FAULT_KINDS, FaultKind
from gpuscope.sim.yamlsrc import ScenarioError, Src, compose

log = logging.getLogger("gpuscope.sim")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")

__all__ = [
    "ClusterSpec",
    "FaultSpec",
    "JobSpec",
    "Scenario",
    "ScenarioError",
    "builtin_scenario",
    "load_scenario",
    "parse_scenario",
]


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int = 8
    gpu_model: str = "H100-SXM5-80GB"
    price_per_gpu_hour: float = 2.5

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"node-{i}" for i in range(self.nodes))

    @property
    def hardware(self) -> GpuModel:
        return GPU_MODELS[self.gpu_model]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A training job or an inference service; fields of the other kind keep their defaults."""

    name: str
    kind: str
    nodes: tuple[str, ...]
    gpus: tuple[int, ...]
    start: float
    end: float
    line: int = 0
    # training
    step_time: float = 1.0
    checkpoint_every: float = 600.0
    checkpoint_seconds: float = 25.0
    steps: int | None = None
    batch_tokens: int = 1_048_576
    seq_len: int = 4096
    learning_rate: float = 3e-4
    warmup_steps: int = 100
    lr_decay_at: float = 0.5
    initial_loss: float = 10.8
    final_loss: float = 2.1
    memory_fraction: float = 0.82
    collective_timeout: float = 600.0
    # inference
    rps: float = 10.0
    model: str = ""
    version: str = "v1"
    capacity_rps: float = 0.0
    latency_seconds: float = 0.9
    ttft_seconds: float = 0.12
    diurnal_amplitude: float = 0.35
    peak_at: float = 50_400.0
    error_rate: float = 0.001

    @property
    def world_size(self) -> int:
        return len(self.nodes) * len(self.gpus)

    @property
    def placement(self) -> tuple[tuple[int, str, int], ...]:
        """(rank, node, gpu): rank r on nodes[r // len(gpus)], gpus[r % len(gpus)] (DESIGN §4)."""
        per = len(self.gpus)
        return tuple((r, self.nodes[r // per], self.gpus[r % per]) for r in range(self.world_size))

    def runs_at(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One injected fault. ``target`` is the file's mapping (gpu and rank as ints), as scorers
    read it; the properties below give its parts typed."""

    index: int
    at: float
    kind: str
    target: dict[str, str | int]
    params: dict[str, Any]
    duration: float | None = None
    line: int = 0
    note: str = ""

    @property
    def node(self) -> str | None:
        return _opt_str(self.target.get("node"))

    @property
    def gpu(self) -> int | None:
        return _opt_int(self.target.get("gpu"))

    @property
    def job(self) -> str | None:
        return _opt_str(self.target.get("job"))

    @property
    def rank(self) -> int | None:
        return _opt_int(self.target.get("rank"))

    @property
    def service(self) -> str | None:
        return _opt_str(self.target.get("service"))

    @property
    def end(self) -> float:
        return math.inf if self.duration is None else self.at + self.duration

    @property
    def spec(self) -> FaultKind:
        return FAULT_KINDS[self.kind]

    def active(self, t: float) -> bool:
        return self.at <= t < self.end

    def label(self) -> str:
        target = ", ".join(f"{k}={v}" for k, v in self.target.items())
        return f"faults[{self.index}] {self.kind} at {self.at:g}s on {target}"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    duration: float
    interval: float
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    description: str = ""
    source: str = ""
    warnings: tuple[str, ...] = field(default=())

    def job(self, name: str) -> JobSpec:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; a bare name that is no file is a built-in scenario's
    (``gpuscope sim-eval xid``)."""
    p = Path(path)
    bare = p.parent == Path(".") and not p.exists()
    if bare and p.stem in builtin_names():
        p = builtin_scenario(p.stem)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        known = f"; built-in scenarios: {', '.join(builtin_names())}" if bare else ""
        raise ScenarioError(
            p.name, None, "", f"cannot read the file ({exc.strerror or exc}){known}"
        ) from None
    except UnicodeDecodeError:
        raise ScenarioError(p.name, None, "", "not UTF-8 text") from None
    return parse_scenario(text, name=p.name)


def parse_scenario(text: str, name: str = "scenario.yaml") -> Scenario:
    """Validate scenario text; ``name`` is the file name used in error messages."""
    root = compose(text, name)
    if root is None:
        raise ScenarioError(name, 1, "", "the scenario is empty")
    return _Parser(name).scenario(Src(root, "", name))


_TOP = frozenset({"name", "description", "seed", "duration", "interval", "cluster", "jobs", "faults"})
_CLUSTER = frozenset({"nodes", "gpus_per_node", "gpu_model", "price_per_gpu_hour"})
_JOB_COMMON = frozenset({"name", "kind", "nodes", "gpus", "start", "end", "memory_fraction"})
_TRAINING = frozenset(
    {
        "step_time",
        "checkpoint_every",
        "checkpoint_seconds",
        "steps",
        "batch_tokens",
        "seq_len",
        "learning_rate",
        "warmup_steps",
        "lr_decay_at",
        "initial_loss",
        "final_loss",
        "collective_timeout",
    }
)
_INFERENCE = frozenset(
    {
        "rps",
        "model",
        "version",
        "capacity_rps",
        "latency_seconds",
        "ttft_seconds",
        "diurnal_amplitude",
        "peak_at",
        "error_rate",
    }
)
_FAULT = frozenset({"at", "kind", "target", "params", "duration", "note"})


class _Parser:
    def __init__(self, file: str) -> None:
        self.file = file
        self.warnings: list[str] = []

    def scenario(self, root: Src) -> Scenario:
        top = root.mapping(_TOP, required=("duration", "cluster"))
        duration = top["duration"].number(0.0, 30 * 86400.0, open_lo=True)
        interval = top["interval"].number(0.0, 3600.0, open_lo=True) if "interval" in top else 1.0
        if interval > duration:
            top["interval"].fail(f"{interval:g} is longer than the duration {duration:g}")
        cluster = self.cluster(top["cluster"])
        jobs = (
            self.jobs(top["jobs"], cluster, duration) if "jobs" in top and not top["jobs"].is_null() else []
        )
        faults: list[FaultSpec] = []
        if "faults" in top and not top["faults"].is_null():
            faults = [
                self.fault(i, src, cluster, jobs, duration) for i, src in enumerate(top["faults"].items())
            ]
        return Scenario(
            name=_identifier(top["name"]) if "name" in top else Path(self.file).stem,
            seed=top["seed"].integer(0, 2**63 - 1) if "seed" in top else 0,
            duration=duration,
            interval=interval,
            cluster=cluster,
            jobs=tuple(jobs),
            faults=tuple(faults),
            description=top["description"].string() if "description" in top else "",
            source=self.file,
            warnings=tuple(self.warnings),
        )

    def cluster(self, src: Src) -> ClusterSpec:
        m = src.mapping(_CLUSTER, required=("nodes",))
        model = "H100-SXM5-80GB"
        if "gpu_model" in m:
            model = m["gpu_model"].string()
            if model not in GPU_MODELS:
                m["gpu_model"].fail(f"unknown GPU model {model!r} (known: {', '.join(GPU_MODELS)})")
        return ClusterSpec(
            nodes=m["nodes"].integer(1, 4096),
            gpus_per_node=m["gpus_per_node"].integer(1, 16) if "gpus_per_node" in m else 8,
            gpu_model=model,
            price_per_gpu_hour=m["price_per_gpu_hour"].number(0.0, 1000.0)
            if "price_per_gpu_hour" in m
            else 2.5,
        )

    # -- jobs -------------------------------------------------------------------------------------

    def jobs(self, src: Src, cluster: ClusterSpec, duration: float) -> list[JobSpec]:
        jobs: list[JobSpec] = []
        slots_src: list[Src] = []
        for item in src.items():
            job = self.job(item, cluster, duration)
            if any(j.name == job.name for j in jobs):
                item.mapping(_JOB_COMMON | _TRAINING | _INFERENCE)["name"].fail(
                    f"job {job.name!r} is defined twice"
                )
            jobs.append(job)
            slots_src.append(item)
        _check_overlaps(jobs, slots_src)
        return jobs

    def job(self, src: Src, cluster: ClusterSpec, duration: float) -> JobSpec:
        m = src.mapping(_JOB_COMMON | _TRAINING | _INFERENCE, required=("name", "kind", "nodes"))
        name = _identifier(m["name"])
        kind = m["kind"].string()
        if kind not in ("training", "inference"):
            m["kind"].fail(f"unknown job kind {kind!r} (known: training, inference)")
        other = _INFERENCE if kind == "training" else _TRAINING
        for key in m:
            if key in other:
                m[key].fail(f"is not a field of {_article(kind)}")
        nodes = self.node_list(m["nodes"], cluster)
        gpus = tuple(range(cluster.gpus_per_node))
        if "gpus" in m:
            gpus = self.gpu_list(m["gpus"], cluster)
        start = m["start"].number(0.0) if "start" in m else 0.0
        if start >= duration:
            m["start"].fail(f"{start:g} is not before the end of the scenario ({duration:g})")
        end = m["end"].number(0.0) if "end" in m else duration
        if end <= start:
            m["end"].fail(f"{end:g} must be after the start ({start:g})")
        fields: dict[str, Any] = {}
        num = _NUMERIC_TRAINING if kind == "training" else _NUMERIC_INFERENCE
        for key, (lo, hi, how) in num.items():
            if key in m:
                if how == "int":
                    fields[key] = m[key].integer(int(lo), int(hi))
                else:
                    fields[key] = m[key].number(lo, hi, open_lo=how == "above")
        if kind == "inference":
            for key in ("model", "version"):
                if key in m:
                    fields[key] = _identifier(m[key])
            fields.setdefault("model", name)
        if "memory_fraction" in m:
            fields["memory_fraction"] = m["memory_fraction"].number(0.01, 0.99)
        elif kind == "inference":
            fields["memory_fraction"] = 0.9
        loss_hi = fields.get("initial_loss", 10.8)
        if kind == "training" and fields.get("final_loss", 2.1) >= loss_hi:
            m["final_loss" if "final_loss" in m else "initial_loss"].fail(
                "final_loss must be below initial_loss"
            )
        return JobSpec(
            name=name, kind=kind, nodes=nodes, gpus=gpus, start=start, end=end, line=src.line, **fields
        )

    def node_list(self, src: Src, cluster: ClusterSpec) -> tuple[str, ...]:
        names: list[str] = []
        for item in src.items():
            node = self.node_name(item, cluster)
            if node in names:
                item.fail(f"{node} is listed twice")
            names.append(node)
        if not names:
            src.fail("must name at least one node")
        return tuple(names)

    def node_name(self, src: Src, cluster: ClusterSpec) -> str:
        node = src.string()
        if node not in cluster.node_names:
            src.fail(f"{node} does not exist: the cluster has node-0..node-{cluster.nodes - 1}")
        return node

    def gpu_list(self, src: Src, cluster: ClusterSpec) -> tuple[int, ...]:
        gpus: list[int] = []
        for item in src.items():
            g = item.integer(0, cluster.gpus_per_node - 1)
            if g in gpus:
                item.fail(f"GPU {g} is listed twice")
            gpus.append(g)
        if not gpus:
            src.fail("must list at least one GPU")
        return tuple(gpus)

    # -- faults -----------------------------------------------------------------------------------

    def fault(
        self, index: int, src: Src, cluster: ClusterSpec, jobs: list[JobSpec], duration: float
    ) -> FaultSpec:
        m = src.mapping(_FAULT, required=("at", "kind", "target"))
        at = m["at"].number(0.0)
        if at >= duration:
            m["at"].fail(f"{at:g} is not before the end of the scenario ({duration:g})")
        kind_name = m["kind"].string()
        kind = FAULT_KINDS.get(kind_name)
        if kind is None:
            m["kind"].fail(f"unknown fault kind {kind_name!r} (known: {', '.join(sorted(FAULT_KINDS))})")
        fault_duration = m["duration"].number(0.0, open_lo=True) if "duration" in m else None
        target = self.target(m["target"], kind, cluster, jobs, at, m["at"])
        params = self.params(m["params"], kind) if "params" in m and not m["params"].is_null() else {}
        merged = {k: p.default for k, p in kind.params.items()} | params
        if "first_rank" in merged and "job" in target:
            job = next(j for j in jobs if j.name == target["job"])
            self.rank_group(m.get("params", src), f"{src.path}.params", merged, job)
        if not kind.simulated:
            msg = f"{self.file}:{src.line}: faults[{index}]: {kind.name!r} is accepted but not simulated yet"
            self.warnings.append(msg)
            log.warning(msg)
        return FaultSpec(
            index=index,
            at=at,
            kind=kind.name,
            target=target,
            params=merged,
            duration=fault_duration,
            line=src.line,
            note=m["note"].string() if "note" in m else "",
        )

    def target(
        self, src: Src, kind: FaultKind, cluster: ClusterSpec, jobs: list[JobSpec], at: float, at_src: Src
    ) -> dict[str, str | int]:
        m = src.mapping(frozenset(kind.target), required=kind.target)
        out: dict[str, str | int] = {}
        if "node" in m:
            out["node"] = self.node_name(m["node"], cluster)
        if "gpu" in m:
            out["gpu"] = m["gpu"].integer(0, cluster.gpus_per_node - 1)
        for key in ("job", "service"):
            if key not in m:
                continue
            wanted = m[key].string()
            job = next((j for j in jobs if j.name == wanted), None)
            if job is None:
                known = ", ".join(j.name for j in jobs) or "none"
                m[key].fail(f"{key} {wanted!r} is not defined (jobs: {known})")
            need = "inference" if key == "service" else kind.job_kind
            if need is not None and job.kind != need:
                m[key].fail(f"{kind.name} needs {_article(need)}; {wanted!r} is {_article(job.kind)}")
            if not job.runs_at(at):
                at_src.fail(f"{at:g} is outside the run of {key} {wanted!r} ({job.start:g}..{job.end:g})")
            out[key] = wanted
            if "rank" in m:
                rank = m["rank"].integer(0)
                if rank >= job.world_size:
                    m["rank"].fail(
                        f"{rank} is beyond the world size of {wanted!r} (ranks 0..{job.world_size - 1})"
                    )
                out["rank"] = rank
        return {k: out[k] for k in kind.target}

    def rank_group(self, src: Src, path: str, params: dict[str, Any], job: JobSpec) -> None:
        """A group of ranks (``first_rank``, ``ranks``) must start inside the job and leave a rank at
        the job's own pace: a group past the world injects nothing, one spanning it is no placement."""
        first, count, world = int(params["first_rank"]), int(params["ranks"]), job.world_size
        if first >= world:
            src.fail(
                f"{first} is beyond the world size of {job.name!r} (ranks 0..{world - 1})",
                f"{path}.first_rank",
            )
        if first == 0 and count >= world:
            src.fail(
                f"ranks 0..{min(count, world) - 1} are the whole of {job.name!r}: no rank is left at the "
                "normal pace to compare with",
                f"{path}.ranks",
            )

    def params(self, src: Src, kind: FaultKind) -> dict[str, Any]:
        out: dict[str, Any] = {}
        allowed = ", ".join(kind.params) or "none"
        for key_src, value in src.free_mapping():
            key = key_src.path.rsplit(".", 1)[-1]
            spec = kind.params.get(key)
            if spec is None:
                key_src.fail(f"unknown parameter of {kind.name} (known: {allowed})")
            if spec.type is bool:
                out[key] = value.boolean()
            elif spec.type is int:
                out[key] = value.integer(
                    None if spec.lo is None else int(spec.lo), None if spec.hi is None else int(spec.hi)
                )
            elif spec.type is float:
                out[key] = value.number(spec.lo, spec.hi)
            else:
                text = value.string()
                if spec.choices and text not in spec.choices:
                    value.fail(f"{text!r} is not one of {', '.join(spec.choices)}")
                out[key] = text
        return out


# (lo, hi, how) of the numeric job fields; how: "int", "at_least" lo, or "above" lo
_NUMERIC_TRAINING: dict[str, tuple[float, float, str]] = {
    "step_time": (0.0, 3600.0, "above"),
    "checkpoint_every": (0.0, 7 * 86400.0, "at_least"),
    "checkpoint_seconds": (10.0, 60.0, "at_least"),
    "steps": (1, 10**9, "int"),
    "batch_tokens": (1, 10**10, "int"),
    "seq_len": (1, 10**7, "int"),
    "learning_rate": (0.0, 10.0, "above"),
    "warmup_steps": (0, 10**8, "int"),
    "lr_decay_at": (0.0, 1.0, "above"),
    "initial_loss": (0.0, 100.0, "above"),
    "final_loss": (0.0, 100.0, "above"),
    "collective_timeout": (1.0, 86400.0, "at_least"),
}
_NUMERIC_INFERENCE: dict[str, tuple[float, float, str]] = {
    "rps": (0.0, 1e6, "above"),
    "capacity_rps": (0.0, 1e7, "above"),
    "latency_seconds": (0.0, 600.0, "above"),
    "ttft_seconds": (0.0, 600.0, "above"),
    "diurnal_amplitude": (0.0, 0.95, "at_least"),
    "peak_at": (0.0, 86400.0, "at_least"),
    "error_rate": (0.0, 0.5, "at_least"),
}


def _opt_str(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: str | int | None) -> int | None:
    return None if value is None else int(value)


def _article(kind: str) -> str:
    return "an inference service" if kind == "inference" else "a training job"


def _identifier(src: Src) -> str:
    value = src.string()
    if not NAME_RE.match(value):
        src.fail(f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 64)")
    return value


def _check_overlaps(jobs: list[JobSpec], srcs: list[Src]) -> None:
    """Two jobs running at the same time may not share a GPU."""
    for b_i, b in enumerate(jobs):
        b_slots = {(n, g) for n in b.nodes for g in b.gpus}
        for a in jobs[:b_i]:
            if not (a.start < b.end and b.start < a.end):
                continue
            shared = sorted(b_slots & {(n, g) for n in a.nodes for g in a.gpus})
            if shared:
                node, gpu = shared[0]
                nodes_src = srcs[b_i].mapping(_JOB_COMMON | _TRAINING | _INFERENCE)["nodes"]
                nodes_src.fail(
                    f"{node} GPU {gpu} is also allocated to job {a.name!r} while both run "
                    f"({max(a.start, b.start):g}..{min(a.end, b.end):g} s)"
                )
