"""RankDetector's cost per rank-second: N jobs x R ranks sending one step record a second.

Synthetic SDK-shaped step records (step time, each rank's collective arrival gap, gradient norm,
allocator fragmentation and retries; fixed per-rank offsets, noise, data-loader hiccups and a few
ranks that turn slow mid-run) go through ``RankDetector`` in virtual time: every second all
records are observed (``on_training``) and the detector evaluates once. Building the records is
not timed. The anchor, timed in the same seconds: the same records gathered per job into arrays
and put through a plain numpy median and quantile per job per second (the job's step time, the
reference quantile of the arrival lags, the median log gradient norm), the floor for this work.
Figures are CPU microseconds per rank-second after the first ``--warmup`` seconds (the detector
learns its groups for 20 steps first).

usage: python bench/bench_ranks.py [--jobs 8] [--ranks 128] [--seconds 120] [--warmup 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from common import print_table
from gpuscope.detect.ranks import RankDetector
from gpuscope.model import TrainingRecord

T0 = 1_700_000_000.0
GPUS = 8
STEP = 1.0


class Jobs:
    """``jobs`` synchronous jobs of ``ranks`` ranks; in each, two ranks turn slow for a while."""

    def __init__(self, jobs: int, ranks: int, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.names = [f"job-{j}" for j in range(jobs)]
        self.ranks = ranks
        self.offsets = self.rng.uniform(0.95, 1.05, (jobs, ranks))
        self.labels = [
            [{"node": f"node-{j}-{r // GPUS}", "gpu": str(r % GPUS)} for r in range(ranks)]
            for j in range(jobs)
        ]
        self.slow = self.rng.integers(0, ranks, (jobs, 2))
        self.retries = np.zeros((jobs, ranks))

    def second(self, k: int) -> list[TrainingRecord]:
        ts = T0 + k * STEP
        out: list[TrainingRecord] = []
        for j, job in enumerate(self.names):
            factor = np.ones(self.ranks)
            if 60 <= k % 300 < 180:
                factor[self.slow[j]] = 1.3
            noise = 1.0 - np.abs(0.012 * self.rng.standard_normal(self.ranks))
            compute = 0.85 * STEP * self.offsets[j] * factor * noise
            hiccup = self.rng.random(self.ranks) < 0.002
            compute[hiccup] += self.rng.uniform(0.3, 1.2, int(hiccup.sum()))
            gap = (compute - compute.min()).tolist()
            step_seconds = float(compute.max()) + 0.15
            grads = np.exp(0.05 * self.rng.standard_normal(self.ranks)).tolist()
            frag = (0.08 + 0.01 * self.rng.random(self.ranks)).tolist()
            self.retries[j] += self.rng.random(self.ranks) < 0.001
            retries = self.retries[j].tolist()
            for r in range(self.ranks):
                metrics = {
                    "loss": 2.0,
                    "step_seconds": step_seconds,
                    "collective_arrival_gap_seconds": gap[r],
                    "grad_norm": grads[r],
                    "memory_fragmentation_ratio": frag[r],
                    "alloc_retries_total": retries[r],
                }
                out.append(TrainingRecord(ts - 0.1, job, r, k, metrics, self.labels[j][r]))
        return out


def anchor(records: list[TrainingRecord], quantile: float) -> float:
    """The floor: each job's records gathered into arrays, a numpy median and quantile per job."""
    jobs: dict[str, dict[int, dict[str, float]]] = {}
    for rec in records:
        jobs.setdefault(rec.job, {})[rec.rank] = rec.metrics
    total = 0.0
    for rows in jobs.values():
        ordered = [rows[r] for r in sorted(rows)]
        step = np.array([m.get("step_seconds", np.nan) for m in ordered])
        gap = np.array([m.get("collective_arrival_gap_seconds", np.nan) for m in ordered])
        grads = np.array([m.get("grad_norm", np.nan) for m in ordered])
        median = float(np.median(step))
        total += float(np.quantile(gap / median, quantile)) + float(np.median(np.log(grads)))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=128, help="ranks per job")
    ap.add_argument("--seconds", type=int, default=120, help="simulated seconds")
    ap.add_argument("--warmup", type=int, default=30, help="seconds left out of the figures")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.seconds <= args.warmup:
        ap.error("--seconds must be more than --warmup")

    jobs = Jobs(args.jobs, args.ranks)
    seconds = [jobs.second(k) for k in range(args.seconds)]
    detector = RankDetector()
    observe: list[float] = []
    evaluate: list[float] = []
    floor: list[float] = []
    findings = 0
    digest = hashlib.sha256()  # of every finding of every second: same results, same digest
    load = os.getloadavg()[0]
    for k, records in enumerate(seconds):
        start = time.process_time()
        anchor(records, detector.ref_quantile)
        mid = time.process_time()
        for rec in records:
            detector.on_training(rec)
        seen = time.process_time()
        out = detector.evaluate(T0 + k * STEP + 0.5)
        end = time.process_time()
        findings = len(out)
        for f in out:
            digest.update(repr((f.rule, f.entity, f.summary, f.value, f.details)).encode())
        if k >= args.warmup:
            floor.append(mid - start)
            observe.append(seen - mid)
            evaluate.append(end - seen)

    rank_seconds = args.jobs * args.ranks
    per = {
        "observe": statistics.fmean(observe) / rank_seconds * 1e6,
        "evaluate": statistics.fmean(evaluate) / rank_seconds * 1e6,
        "anchor_numpy_floor": statistics.fmean(floor) / rank_seconds * 1e6,
    }
    per["detector_total"] = per["observe"] + per["evaluate"]
    result = {
        "jobs": args.jobs,
        "ranks_per_job": args.ranks,
        "measured_seconds": len(observe),
        "us_per_rank_second": per,
        "ms_per_second_at_this_size": {k: v * rank_seconds / 1e3 for k, v in per.items()},
        "ratio_to_anchor": per["detector_total"] / per["anchor_numpy_floor"],
        "findings_at_end": findings,
        "findings_digest": digest.hexdigest()[:16],
        "load_average": [load, os.getloadavg()[0]],
    }
    print_table(
        f"RankDetector: {args.jobs} jobs x {args.ranks} ranks at 1 Hz, {len(observe)} s measured",
        ["what", "CPU µs per rank-second", f"ms per second at {rank_seconds:,} ranks"],
        [[k, f"{v:.2f}", f"{v * rank_seconds / 1e3:.1f}"] for k, v in per.items()],
    )
    print(
        f"detector / anchor: {result['ratio_to_anchor']:.1f}x; findings at the end: {findings} "
        f"(digest of all {result['findings_digest']}); "
        f"load average {load:.1f} → {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
