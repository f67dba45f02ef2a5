"""The straggler and step-time rules on every real trace with per-worker timing, through ``gpuscope replay``.

Of ../shared/data (skipped when absent) only the Alibaba PAI mini-batch times
(cluster-trace-gpu-v2020) have per-worker timing; the BLOOM chronicles are one line per iteration
for the whole job (see eval_real_traces.py). Each job is written as a replay CSV
(``ts,job,rank,step,node,gpu,step_seconds``; one sample = one second, ``step_seconds`` the
normalised mini-batch time) and replayed through the hub exactly as ``gpuscope replay`` does.

No labels ship per worker, so the ground truth is this written rule:

* straggler: a worker whose time relative to the peer median of its sample is at least 1.15x its
  own healthy ratio (the median ratio over the job's first 20 % of samples) for at least 3
  consecutive samples;
* step-time regression: the job's median time at least 1.15x its healthy median (first 20 %) for
  at least 3 consecutive samples.

Recall and precision are per job over workers (straggler) or over the job (step time): a worker
flagged by ``training_straggler`` at any time is a positive.

usage: python eval/eval_replay_traces.py [--data DIR]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from gpuscope.simeval.replay import replay_document

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RATIO, RUN, HEALTHY_SHARE = 1.15, 3, 0.2


def _runs(flags: list[bool]) -> bool:
    n = 0
    for f in flags:
        n = n + 1 if f else 0
        if n >= RUN:
            return True
    return False


def truth(times: dict[int, dict[int, float]]) -> tuple[set[int], bool]:
    """(workers that straggle, whether the job's step time regressed) by the written rule."""
    samples = sorted(times)
    healthy = samples[: max(1, int(HEALTHY_SHARE * len(samples)))]
    workers = sorted({w for s in samples for w in times[s]})
    medians = {s: float(np.median(list(times[s].values()))) for s in samples}
    base = {
        w: float(np.median([times[s][w] / medians[s] for s in healthy if w in times[s]] or [1.0]))
        for w in workers
    }
    slow = {
        w for w in workers if _runs([times[s].get(w, 0.0) / medians[s] >= RATIO * base[w] for s in samples])
    }
    job_base = float(np.median([medians[s] for s in healthy]))
    return slow, _runs([medians[s] >= RATIO * job_base for s in samples])


def score(truth_set: set[str], found: set[str]) -> str:
    hit = len(truth_set & found)
    recall = f"{hit / len(truth_set):.2f}" if truth_set else "n/a (no positives)"
    precision = f"{hit / len(found):.2f}" if found else "n/a (nothing flagged)"
    return f"recall {recall}, precision {precision} (truth {sorted(truth_set)}, flagged {sorted(found)})"


def evaluate(path: Path, workdir: Path) -> None:
    times: dict[int, dict[int, float]] = defaultdict(dict)
    for row in csv.DictReader(path.open()):
        times[int(row["time"])][int(row["worker"])] = float(row["batch_time_norm"])
    job = path.stem
    replay_csv = workdir / f"{job}.csv"
    with replay_csv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "job", "rank", "step", "node", "gpu", "step_seconds"])
        for s in sorted(times):
            for worker, seconds in sorted(times[s].items()):
                w.writerow([s, job, worker, s, f"worker-{worker}", 0, seconds])
    doc = replay_document(replay_csv)
    slow, regressed = truth(times)
    stragglers = {a["entity"]["rank"] for a in doc["alerts"] if a["rule"] == "training_straggler"}
    step_time = any(a["rule"] == "step_time_regression" for a in doc["alerts"])
    others = sorted({a["rule"] for a in doc["alerts"]} - {"training_straggler", "step_time_regression"})
    print(
        f"{job}: {len(times)} samples x {len({w for s in times.values() for w in s})} workers, "
        f"{doc['records']} records, {len(doc['refused'])} refused"
    )
    print(f"  training_straggler:   {score({str(w) for w in slow}, stragglers)}")
    print(f"  step_time_regression: {score({job} if regressed else set(), {job} if step_time else set())}")
    print(f"  other rules raised: {others or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    folder = args.data / "alibaba_v2020_minibatch_time"
    if not folder.is_dir():
        print(f"SKIP: no per-worker traces under {args.data}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(folder.glob("job_*.csv")):
            evaluate(path, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
