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

usage: python eval/eval_random_scenarios.py [--seed 1] [--count 20] [--out DIR] [--from-out]
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--first", type=int, default=0, help="index of the first scenario drawn")
    parser.add_argument("--out", type=Path, default=Path("random-scenarios"))
    parser.add_argument("--from-out", action="store_true", help="score the documents in --out")
    parser.add_argument("--scorer", type=Path, default=data_dir().parent / "tools" / "score.py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ours, theirs = Tally(), Tally()
    our_notes: list[str] = []
    their_notes: list[str] = []
    for index in range(args.first, args.first + args.count):
        doc = draw(args.seed, index)
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
