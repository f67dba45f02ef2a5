"""Scenarios we did not write: a seeded random suite drawn from DESIGN §4 alone, scored two ways.

Each scenario is drawn the way an outsider would write one from the scenario contract: a random
fleet (2-4 nodes of 4 or 8 GPUs; one or two training jobs on whole nodes or a GPU subset, some
starting late; an inference service on part of a node), 20-40 simulated minutes, and 1-4 faults of
DESIGN's kinds only, on the targets DESIGN names, with the contract's defaults or moderate
parameters (DESIGN documents no ranges; the values drawn are ones its examples use or near them).
Faults overlap in time, share a job or node, and some come within the first two minutes. About one
in six scenarios is healthy. A fault that ends its target for good (a crash, a lost GPU or node, a
dead rank, a fatal XID or an uncorrectable ECC error, a hang) is the last fault drawn in its blast
radius: nothing is left to detect there afterwards (nor at the same second), so a later fault
could not count as a miss.

Every scenario's YAML and its ``sim-eval --json`` document go to ``--out``; the runs go through
``gpuscope.simeval.runner.run_scenario`` and are scored by ``gpuscope.simeval.report.evaluate``
and, when ``shared/tools/score.py`` is found beside the repository (as ``eval/datapath.py``
finds ``shared/data``; or ``--scorer``), by the outside scorer too; skipped cleanly without.
Printed: per family (rule) recall, precision and time to detect from each scorer, every MISSED
fault and every UNEXPLAINED alert with its scenario, P1/P2 on healthy scenarios, and flapping.

``--from-out`` scores the documents already in ``--out`` instead of simulating again.

``--profile wide`` draws the shapes DESIGN §4 allows that the base profile does not (scenarios
``wide-S-NNN``; the base profile's draws, ``random-S-NNN``, stay what they were): 2-5 nodes; a
training job over 1-3 whole nodes; the service on half a node (1/2), a whole node (3/10) or one
GPU (1/5); a fine-tuning job on the rest of the service's node (one GPU of it 3 times in 10) or on
a node of its own, starting late (3/10) or ending before the run does (1 in 7); on a free node, 3
times in 5, two jobs one after the other on the same one GPU, two or the whole node with an idle
gap of 30, 60 or 120 s between them; ``interval`` 1 (7/10), 2 or 5 (3/20 each); a
``price_per_gpu_hour`` of 1.5, 2.5 or 4. Faults: the base families with training faults twice as
likely; XID codes from both of DESIGN §3's classes evenly (fatal 48, 63, 64, 74, 79, 92, 94, 95,
119, 120; application 13, 31, 43, 45, 68); ``bad_version`` names its version half the time; a
drawn duration is short (60, 90 or 120 s) half the time, except for kinds judged over minutes
(``TREND_KINDS``); after the first GPU fault, 2 in 5 strike a GPU already struck, and 1 in 10 of
the others a GPU no job holds; a fault on a job starts a minute into its run and 10 minutes before
its end; straggler and gradient skew are not drawn on a one-rank job (no peer to differ from); a
fault is not drawn on a job an earlier fault silenced (``SILENCING``: idle, no checkpoints, the
other loss shape).

usage: python eval/eval_random_scenarios.py [--seed 1 [2 ...]] [--count 20] [--out DIR] [--from-out]
                                            [--profile base|wide]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from datapath import data_dir
from eval_families import Tally, from_document, play

from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.report import evaluate

GPU_KINDS = (
    "xid",
    "ecc_dbe",
    "ecc_sbe_storm",
    "gpu_lost",
    "thermal_throttle",
    "power_throttle",
    "gpu_slow",
    "nvlink_errors",
    "pcie_replay",
)
NODE_KINDS = ("network_degraded", "node_down")
JOB_KINDS = ("idle_allocation", "job_crash")
TRAINING_KINDS = (
    "training_hang",
    "step_time_regression",
    "loss_nan",
    "loss_spike",
    "loss_divergence",
    "loss_plateau",
    "grad_explosion",
    "checkpoint_failure",
    "checkpoint_corrupt",
    "checkpoint_stop",
)
RANK_KINDS = ("rank_dropout", "straggler", "gradient_skew", "memory_fragmentation")
SERVICE_KINDS = (
    "latency_spike",
    "ttft_regression",
    "error_burst",
    "queue_buildup",
    "kv_cache_pressure",
    "prediction_drift",
    "confidence_shift",
    "input_drift",
    "business_drop",
    "bad_version",
)
#: faults after which their target has nothing left to detect (see the module docstring)
ENDING = frozenset({"job_crash", "node_down", "gpu_lost", "rank_dropout", "training_hang", "ecc_dbe"})
FATAL_XIDS = (79, 48, 63, 64, 74, 94, 95)
APP_XIDS = (13, 31, 43)


def _ends(fault: dict[str, Any]) -> bool:
    """Whether ``fault`` ends its target for good (see the module docstring)."""
    fatal_xid = fault["kind"] == "xid" and fault["params"]["code"] in FATAL_XIDS
    return fault["kind"] in ENDING or fatal_xid


def _params(rng: random.Random, kind: str) -> dict[str, Any]:
    """The contract's defaults half the time; else a moderate value of a documented parameter."""
    if kind == "xid":
        return {"code": rng.choice(FATAL_XIDS + APP_XIDS)}
    if rng.random() < 0.5:
        return {}
    moderate: dict[str, dict[str, Any]] = {
        "straggler": {"slowdown": round(rng.uniform(1.3, 2.0), 2)},
        "gpu_slow": {"slowdown": round(rng.uniform(1.25, 1.8), 2)},
        "thermal_throttle": {"temp": rng.choice([90, 92, 95])},
        "loss_spike": {"factor": rng.choice([3, 4, 5])},
        "step_time_regression": {"factor": round(rng.uniform(1.3, 2.0), 2)},
        "latency_spike": {"factor": round(rng.uniform(2.0, 4.0), 1)},
        "ttft_regression": {"factor": round(rng.uniform(2.0, 4.0), 1)},
        "error_burst": {"error_rate": round(rng.uniform(0.1, 0.4), 2)},
        "checkpoint_failure": {"all_ranks": rng.random() < 0.5},
    }
    return moderate.get(kind, {})


@dataclass
class Fleet:
    nodes: int
    gpus: int
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def gpus_of(self, job: dict[str, Any]) -> list[tuple[str, int]]:
        return [(n, g) for n in job["nodes"] for g in job.get("gpus", range(self.gpus))]


def _fleet(rng: random.Random) -> Fleet:
    nodes = rng.randint(2, 4)
    fleet = Fleet(nodes, rng.choice([4, 8]) if nodes <= 3 else 4)
    free = [f"node-{i}" for i in range(nodes)]
    span = rng.randint(1, min(2, nodes - 1))
    main = {
        "name": "pretrain",
        "kind": "training",
        "nodes": free[:span],
        "step_time": round(rng.uniform(0.6, 2.0), 1),
        "checkpoint_every": rng.choice([300, 600]),
    }
    fleet.jobs.append(main)
    free = free[span:]
    half = list(range(fleet.gpus // 2))
    api = {
        "name": "api",
        "kind": "inference",
        "nodes": [free[0]],
        "gpus": half,
        "rps": rng.choice([10, 20, 30, 40]),
        "model": "chat",
        "version": f"v{rng.randint(1, 9)}",
    }
    fleet.jobs.append(api)
    ft: dict[str, Any] = {
        "name": "finetune",
        "kind": "training",
        "step_time": round(rng.uniform(0.5, 1.2), 1),
        "checkpoint_every": 300,
    }
    if rng.random() < 0.5:
        ft.update(nodes=[free[0]], gpus=list(range(fleet.gpus // 2, fleet.gpus)))
    elif len(free) > 1:
        ft.update(nodes=[free[1]])
    else:
        return fleet
    if rng.random() < 0.3:
        ft["start"] = rng.choice([60, 120, 300])
    fleet.jobs.append(ft)
    return fleet


def _blast(fleet: Fleet, target: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Nodes and jobs a fault on ``target`` touches."""
    by_name = {j["name"]: j for j in fleet.jobs}
    job = target.get("job") or target.get("service")
    nodes = {target["node"]} if "node" in target else set(by_name[job]["nodes"])
    jobs = {j["name"] for j in fleet.jobs if nodes & set(j["nodes"])}
    return nodes, jobs


def draw(seed: int, index: int) -> dict[str, Any]:
    """One scenario document (DESIGN §4), from ``seed`` and its index."""
    rng = random.Random(seed * 100_003 + index)
    fleet = _fleet(rng)
    duration = rng.choice([1200, 1500, 1800, 2100, 2400])
    healthy = rng.random() < 1 / 6
    trainings = [j for j in fleet.jobs if j["kind"] == "training"]
    service = next(j for j in fleet.jobs if j["kind"] == "inference")
    faults: list[dict[str, Any]] = []
    taken: set[tuple[str, str]] = set()
    for _ in range(0 if healthy else rng.randint(1, 4)):
        family = rng.choice(["gpu", "gpu", "node", "job", "training", "rank", "service", "service"])
        job = rng.choice(trainings)
        target: dict[str, Any]
        if family == "gpu":
            kind = rng.choice(GPU_KINDS)
            host = rng.choice(fleet.jobs)
            node, gpu = rng.choice(fleet.gpus_of(host))
            target = {"node": node, "gpu": gpu}
        elif family == "node":
            kind = rng.choice(NODE_KINDS)
            target = {"node": rng.choice(job["nodes"])}
        elif family == "job":
            kind = rng.choice(JOB_KINDS)
            target = {"job": rng.choice(fleet.jobs)["name"]}
        elif family == "training":
            kind = rng.choice(TRAINING_KINDS)
            target = {"job": job["name"]}
        elif family == "rank":
            kind = rng.choice(RANK_KINDS)
            target = {"job": job["name"], "rank": rng.randrange(len(fleet.gpus_of(job)))}
        else:
            kind = rng.choice(SERVICE_KINDS)
            target = {"service": service["name"]}
        key = (kind, json.dumps(target, sort_keys=True))
        if key in taken:
            continue
        taken.add(key)
        earliest = 30
        for name in (target.get("job"), target.get("service"), family == "gpu" and host["name"]):
            start = next((j.get("start", 0) for j in fleet.jobs if j["name"] == name), 0)
            earliest = max(earliest, start + 60)
        if faults and rng.random() < 0.5:  # overlap the previous fault, often on its target
            at = min(faults[-1]["at"] + rng.randint(0, 180), duration - 900)
        elif rng.random() < 0.2:
            at = rng.randint(30, 120)  # near the start
        else:
            at = rng.randint(120, duration - 900)
        fault: dict[str, Any] = {"at": max(at, earliest), "kind": kind, "target": target}
        params = _params(rng, kind)
        if params:
            fault["params"] = params
        if rng.random() < 0.5:
            fault["duration"] = rng.choice([300, 600, 900])
        faults.append(fault)
    # a fault that ends its blast radius goes first among those at its second: one drawn at the
    # same second as it has nothing left to detect either
    faults.sort(key=lambda f: (f["at"], not _ends(f)))
    kept: list[dict[str, Any]] = []
    ended: list[tuple[float, set[str], set[str]]] = []
    for f in faults:
        nodes, jobs = _blast(fleet, f["target"])
        if any(at <= f["at"] and (nodes & n or jobs & j) for at, n, j in ended):
            continue
        kept.append(f)
        if _ends(f):
            ended.append((f["at"], nodes, jobs))
    return {
        "name": f"random-{seed}-{index:03d}",
        "description": "drawn by eval/eval_random_scenarios.py from DESIGN §4",
        "seed": seed * 1000 + index,
        "duration": duration,
        "interval": 1,
        "cluster": {"nodes": fleet.nodes, "gpus_per_node": fleet.gpus, "gpu_model": "H100-SXM5-80GB"},
        "jobs": fleet.jobs,
        "faults": kept,
    }


#: faults that silence their own job while they last, and the kinds of fault on that job they
#: silence: an idle job makes no step and serves no request (no loss, checkpoint, rank pace or
#: request to judge); a job that stopped checkpointing has no checkpoint left to fail; the loss
#: follows one shape at a time (the simulator plays the later of a plateau and a divergence)
SILENCING: dict[str, frozenset[str]] = {
    "idle_allocation": frozenset(TRAINING_KINDS + SERVICE_KINDS)
    | {"straggler", "gradient_skew", "memory_fragmentation"},
    "checkpoint_stop": frozenset({"checkpoint_failure", "checkpoint_corrupt"}),
    "loss_plateau": frozenset({"loss_divergence"}),
    "loss_divergence": frozenset({"loss_plateau"}),
}


def _prune(fleet: Fleet, faults: list[dict[str, Any]], fatal_xids: tuple[int, ...]) -> list[dict[str, Any]]:
    """``faults`` in time order, less those an earlier fault (or one at the same second) had ended
    the blast radius of (see the module docstring) or silenced the job of (``SILENCING``): nothing
    is left there to detect."""

    def ends(f: dict[str, Any]) -> bool:
        return f["kind"] in ENDING or (f["kind"] == "xid" and f["params"]["code"] in fatal_xids)

    kept: list[dict[str, Any]] = []
    ended: list[tuple[float, set[str], set[str]]] = []
    quiet: list[tuple[float, float, str, frozenset[str]]] = []
    for f in sorted(faults, key=lambda f: (f["at"], not (ends(f) or f["kind"] in SILENCING))):
        nodes, jobs = _blast(fleet, f["target"])
        if any(at <= f["at"] and (nodes & n or jobs & j) for at, n, j in ended):
            continue
        job = f["target"].get("job") or f["target"].get("service")
        if any(a <= f["at"] < b and job == j and f["kind"] in kinds for a, b, j, kinds in quiet):
            continue
        kept.append(f)
        if ends(f):
            ended.append((f["at"], nodes, jobs))
        if f["kind"] in SILENCING:
            quiet.append((f["at"], f["at"] + f.get("duration", math.inf), job, SILENCING[f["kind"]]))
    return kept


# -- the wide profile ------------------------------------------------------------------------------

WIDE_FATAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)
WIDE_APP_XIDS = (13, 31, 43, 45, 68)
#: short faults (60-120 s) half the time a duration is drawn, else the base profile's
WIDE_DURATIONS = ((60, 90, 120), (300, 600, 900))
#: kinds whose rule judges a trend or a cadence over minutes (or whose next checkpoint may be 10
#: minutes away): a 1-2 minute fault of these has no signal to find, so they are never drawn short
TREND_KINDS = frozenset(
    {
        "loss_plateau",
        "loss_divergence",
        "prediction_drift",
        "confidence_shift",
        "input_drift",
        "business_drop",
        "checkpoint_stop",
        "checkpoint_failure",
        "checkpoint_corrupt",
        "idle_allocation",
        "memory_fragmentation",
        "gpu_slow",
        "ecc_sbe_storm",
        "pcie_replay",
    }
)
#: the base profile's families, training faults twice as likely
WIDE_FAMILIES = ("gpu", "gpu", "node", "job", "training", "training", "rank", "service", "service")
#: kinds judged against the job's other ranks: not drawn on a one-rank job (no peer to differ from)
PEER_KINDS = frozenset({"straggler", "gradient_skew"})


def _wide_params(rng: random.Random, kind: str, service: dict[str, Any]) -> dict[str, Any]:
    """``_params``, with XIDs of both classes drawn evenly over DESIGN §3's codes and a named
    version for ``bad_version`` half the time."""
    if kind == "xid":
        return {"code": rng.choice(rng.choice((WIDE_FATAL_XIDS, WIDE_APP_XIDS)))}
    if kind == "bad_version" and rng.random() < 0.5:
        return {"version": f"v{int(service['version'][1:]) + rng.randint(1, 3)}"}
    return _params(rng, kind)


def _wide_fleet(rng: random.Random, duration: int) -> Fleet:
    """2-5 nodes; a training job on 1-3 whole nodes; the service on half a node, a whole node or
    one GPU; the rest of its node to a fine-tuning job (one GPU when the service leaves one), or a
    node of its own; on a free node, sometimes two short jobs one after the other with an idle gap
    of 30-120 s (each on one GPU, two, or the node), or one job that ends before the run does."""
    nodes = rng.randint(2, 5)
    fleet = Fleet(nodes, rng.choice([4, 8]) if nodes <= 3 else 4)
    free = [f"node-{i}" for i in range(nodes)]
    span = rng.randint(1, min(3, nodes - 1))
    fleet.jobs.append(
        {
            "name": "pretrain",
            "kind": "training",
            "nodes": free[:span],
            "step_time": round(rng.uniform(0.6, 2.0), 1),
            "checkpoint_every": rng.choice([300, 600]),
        }
    )
    free = free[span:]
    api: dict[str, Any] = {
        "name": "api",
        "kind": "inference",
        "nodes": [free.pop(0)],
        "rps": rng.choice([10, 20, 30, 40]),
        "model": "chat",
        "version": f"v{rng.randint(1, 9)}",
    }
    shape = rng.choices(["half", "node", "one"], weights=[0.5, 0.3, 0.2])[0]
    rest: list[int] = []
    if shape == "half":
        api["gpus"], rest = list(range(fleet.gpus // 2)), list(range(fleet.gpus // 2, fleet.gpus))
    elif shape == "one":
        api["gpus"], rest = [0], list(range(1, fleet.gpus))
    fleet.jobs.append(api)
    ft: dict[str, Any] = {"name": "finetune", "kind": "training"}
    ft["step_time"] = round(rng.uniform(0.5, 1.2), 1)
    ft["checkpoint_every"] = 300
    if rest and rng.random() < 0.6:
        ft.update(nodes=list(api["nodes"]), gpus=rest if rng.random() < 0.7 else rest[-1:])
    elif free and rng.random() < 0.5:
        ft.update(nodes=[free.pop(0)])
    else:
        ft = {}
    if ft:
        if rng.random() < 0.3:
            ft["start"] = rng.choice([60, 120, 300])
        elif rng.random() < 0.2:
            ft["end"] = rng.randrange(duration // 2, duration - 300, 30)
        fleet.jobs.append(ft)
    if free and rng.random() < 0.6:
        gpus = rng.choice([[0], [0, 1], list(range(fleet.gpus))])
        first_end = rng.randrange(duration // 4, duration // 2, 30)
        gap = rng.choice([30, 60, 120])
        for name, start, end in (("sweep-a", 0, first_end), ("sweep-b", first_end + gap, None)):
            job = {"name": name, "kind": "training", "nodes": [free[0]], "gpus": list(gpus)}
            job["step_time"] = round(rng.uniform(0.5, 1.2), 1)
            job["checkpoint_every"] = 300
            if start:
                job["start"] = start
            if end is not None:
                job["end"] = end
            fleet.jobs.append(job)
    return fleet


def _window(job: dict[str, Any] | None, duration: int) -> tuple[int, int]:
    """When a fault on ``job`` may start: a minute into its run, and 10 minutes before its end
    (15 before the scenario's) so that a rule has time to judge while the job still runs."""
    start = job.get("start", 0) if job else 0
    end = job.get("end", duration) if job else duration
    return max(30, start + 60), min(duration - 900, end - 600)


def draw_wide(seed: int, index: int) -> dict[str, Any]:
    """One scenario of the wide profile: every shape ``draw`` draws, and the shapes DESIGN §4
    allows that it does not (see the module docstring)."""
    rng = random.Random(seed * 100_003 + index)
    duration = rng.choice([1200, 1500, 1800, 2100, 2400])
    fleet = _wide_fleet(rng, duration)
    interval = rng.choices([1, 2, 5], weights=[0.7, 0.15, 0.15])[0]
    healthy = rng.random() < 1 / 6
    service = next(j for j in fleet.jobs if j["kind"] == "inference")
    taken_gpus = {slot for j in fleet.jobs for slot in fleet.gpus_of(j)}
    spare = [(f"node-{n}", g) for n in range(fleet.nodes) for g in range(fleet.gpus)]
    spare = [slot for slot in spare if slot not in taken_gpus]
    faults: list[dict[str, Any]] = []
    struck: list[dict[str, Any]] = []  # targets of the GPU faults drawn so far
    taken: set[tuple[str, str]] = set()
    for _ in range(0 if healthy else rng.randint(1, 4)):
        family = rng.choice(WIDE_FAMILIES)
        # jobs that run long enough for a fault on them to be judged
        jobs = [j for j in fleet.jobs if _window(j, duration)[0] <= _window(j, duration)[1]]
        trainings = [j for j in jobs if j["kind"] == "training"]
        job: dict[str, Any] | None = rng.choice(jobs if family in ("gpu", "job") else trainings)
        target: dict[str, Any]
        if family == "gpu":
            kind = rng.choice(GPU_KINDS)
            if struck and rng.random() < 0.4:  # a second fault on a GPU already struck
                target = dict(rng.choice(struck))
                job = next(
                    (j for j in fleet.jobs if (target["node"], target["gpu"]) in fleet.gpus_of(j)), None
                )
            elif spare and rng.random() < 0.1:  # a GPU no job holds
                node, gpu = rng.choice(spare)
                target, job = {"node": node, "gpu": gpu}, None
            else:
                assert job is not None
                node, gpu = rng.choice(fleet.gpus_of(job))
                target = {"node": node, "gpu": gpu}
            struck.append(target)
        elif family == "node":
            assert job is not None
            kind = rng.choice(NODE_KINDS)
            target, job = {"node": rng.choice(job["nodes"])}, None
        elif family == "job":
            assert job is not None
            kind = rng.choice(JOB_KINDS)
            target = {"job": job["name"]}
        elif family == "training":
            assert job is not None
            kind = rng.choice(TRAINING_KINDS)
            target = {"job": job["name"]}
        elif family == "rank":
            assert job is not None
            world = len(fleet.gpus_of(job))
            kind = rng.choice([k for k in RANK_KINDS if world > 1 or k not in PEER_KINDS])
            target = {"job": job["name"], "rank": rng.randrange(world)}
        else:
            kind = rng.choice(SERVICE_KINDS)
            target, job = {"service": service["name"]}, service
        key = (kind, json.dumps(target, sort_keys=True))
        lo, hi = _window(job, duration)
        if key in taken or lo > hi:
            continue
        taken.add(key)
        if faults and rng.random() < 0.5:  # overlap the previous fault, often on its target
            at = faults[-1]["at"] + rng.randint(0, 180)
        elif rng.random() < 0.2:
            at = rng.randint(30, 120)  # near the start
        else:
            at = rng.randint(120, duration - 900)
        fault: dict[str, Any] = {"at": min(max(at, lo), hi), "kind": kind, "target": target}
        params = _wide_params(rng, kind, service)
        if params:
            fault["params"] = params
        if rng.random() < 0.5:
            spans = WIDE_DURATIONS[1:] if kind in TREND_KINDS else WIDE_DURATIONS
            fault["duration"] = rng.choice(rng.choice(spans))
        faults.append(fault)
    return {
        "name": f"wide-{seed}-{index:03d}",
        "description": "drawn by eval/eval_random_scenarios.py --profile wide from DESIGN §4",
        "seed": seed * 1000 + index,
        "duration": duration,
        "interval": interval,
        "cluster": {
            "nodes": fleet.nodes,
            "gpus_per_node": fleet.gpus,
            "gpu_model": "H100-SXM5-80GB",
            "price_per_gpu_hour": rng.choice([1.5, 2.5, 4.0]),
        },
        "jobs": fleet.jobs,
        "faults": _prune(fleet, faults, WIDE_FATAL_XIDS),
    }


def show(title: str, tally: Tally, notes: list[str]) -> None:
    """One scorer's per-family table, its totals and its notes (misses, unexplained alerts)."""
    print(f"\n{title}\n" + "\n".join(tally.rows()))
    print(tally.totals())
    for note in notes:
        print(f"  {note}")


_ROW = re.compile(r"^\s+(DETECTED|MISSED)\s+(\S+)\s+(\S+)\s+(?:ttd=\s*([\d.]+)s\s+)?target=(.*)$")
_STRAY = re.compile(r"^\s+UNEXPLAINED (\S+) (\S+) at (\S+) (.*)$")
_TOTAL = re.compile(r"alerts=(\d+)$")


def outside(scorer: Path, name: str, yaml_path: Path, doc_path: Path, tally: Tally, notes: list[str]) -> None:
    """Score one run with the outside scorer; its rows into ``tally`` (it lists 10 strays at most)."""
    out = subprocess.run(
        [sys.executable, str(scorer), str(yaml_path), str(doc_path)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    alerts = from_document(json.loads(doc_path.read_text()))
    for a in alerts:
        tally.fired[a.rule] += 1
    strays = 0
    for line in out.splitlines():
        if m := _ROW.match(line):
            verdict, kind, rule, ttd, target = m.groups()
            tally.faults[rule] += 1
            if verdict == "DETECTED":
                tally.found[rule] += 1
                tally.ttd[rule].append(float(ttd))
            else:
                notes.append(f"{name}: MISSED {kind} {target}")
        elif m := _STRAY.match(line):
            severity, rule, at, entity = m.groups()
            tally.stray[rule] += 1
            strays += 1
            notes.append(f"{name}: UNEXPLAINED {severity} {rule} at {float(at):.0f} {entity}")
        elif (m := _TOTAL.search(line)) and strays == 10:
            notes.append(f"{name}: the outside scorer lists 10 unexplained alerts at most")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[1], help="one or more seeds, one table")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--first", type=int, default=0, help="index of the first scenario drawn")
    parser.add_argument(
        "--profile", choices=("base", "wide"), default="base", help="the shapes drawn (module docstring)"
    )
    parser.add_argument("--out", type=Path, default=Path("random-scenarios"))
    parser.add_argument("--from-out", action="store_true", help="score the documents in --out")
    parser.add_argument("--scorer", type=Path, default=data_dir().parent / "tools" / "score.py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ours, theirs = Tally(), Tally()
    our_notes: list[str] = []
    their_notes: list[str] = []
    for seed, index in itertools.product(args.seed, range(args.first, args.first + args.count)):
        doc = (draw_wide if args.profile == "wide" else draw)(seed, index)
        name = doc["name"]
        yaml_path, doc_path = args.out / f"{name}.yaml", args.out / f"{name}.json"
        yaml_path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
        scenario = load_scenario(yaml_path)
        alerts, wall = play(scenario, doc_path, reuse=args.from_out)
        report = evaluate(scenario, alerts)
        our_notes += ours.add(name, scenario, alerts, report)
        if args.scorer.is_file():
            outside(args.scorer, name, yaml_path, doc_path, theirs, their_notes)
        kinds = ",".join(f["kind"] for f in doc["faults"]) or "healthy"
        print(f"{name} [{kinds}]: {len(alerts)} alerts, {report.recall:.2f} recall{wall}", flush=True)
    show("our scorer (gpuscope.simeval.report.evaluate)", ours, our_notes)
    if args.scorer.is_file():
        show(f"outside scorer ({args.scorer.name})", theirs, their_notes)
    else:
        print(f"\noutside scorer: {args.scorer} not found, skipped")
    print(f"\nP1/P2 on healthy scenarios: {len(ours.healthy_p1p2)} {ours.healthy_p1p2}")
    print(f"flapping (steady state): {len(ours.flaps)} {ours.flaps}")


if __name__ == "__main__":
    main()
