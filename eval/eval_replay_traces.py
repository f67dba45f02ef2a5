"""The straggler and step-time rules on every real trace with per-worker timing, through ``gpuscope replay``.

Of ../shared/data (skipped when absent) only the Alibaba PAI mini-batch times
(cluster-trace-gpu-v2020, ``alibaba_v2020_minibatch_time/job_*.csv``) have per-worker timing:
the BLOOM chronicles are one line per iteration of the whole job (see eval_real_traces.py), the
other folders are serving traces, request traces or distributions. Every ``job_*.csv`` there is
scored, so more jobs of that set are picked up as they are added. Each job is written as a replay
CSV (``ts,job,rank,step,node,gpu,step_seconds``; ``ts`` the trace's own clock, one sample every
10 s, ``step_seconds`` the normalised mini-batch time) and replayed through the hub exactly as
``gpuscope replay`` does.

The source labels workers (job 1: worker 6 turns slow mid-training; job 2: stable, fixed offsets),
not episodes, so the episodes are found by this written rule, the same for every job:

* a sample of a worker whose value equals its previous one is that reading logged again, not a
  new measurement: the logs repeat 28-60 % of their readings, and a repeat is an exact copy of a
  noisy integer, 6 to 190 times as frequent as a difference of one unit (docs/scenarios.md,
  twelfth round). A worker's *new readings* are its samples that are not copies;
* a worker's *pace* at a sample is its time over its own level, after the job-wide factor (the
  median over the workers of their time over their level) is taken out: fixed offsets and speed
  groups do not move the reference, and it holds while fewer than half of the workers slow down.
  Its level is the median of its last 30 new readings with a pace below 1.15 (the new readings of
  its first 30 samples seed it): a worker that gets faster or drifts slowly sets a new level, a
  slowdown never does. Only samples with at least 3 workers count (a lone worker has no peers); a
  copy keeps its reading's time (the latest measurement);
* a straggler episode is a run of samples with a pace of at least 1.15 (one sample below it
  inside the run does not end it) lasting at least 60 s (6 samples at this trace's 10 s) *with
  at least 3 new readings at 1.15 or more*: a P2 alert asks someone to act, a 15 % slowdown that
  is over in half a minute costs the job less than 5 s, and one or two readings logged again for
  a minute are one or two measurements, not a slowdown known to have lasted;
* shorter runs at 1.15 (2 new readings or more), runs at 1.10 with at least 3 new readings, and
  runs that start while the level is still being learned (a placement, slow from the start, is
  ``slow_placement``'s business) are real but not required: an alert on one is not a false
  positive, and missing one is not a miss.

The third round's rule, which counted a copy as a sample (its level the median of its last 30
samples, an episode 6 samples at 1.15, allowed runs 2 samples at 1.15 or 3 at 1.10), is scored
beside it on the same alerts (``samples rule``).

Scores per job: episode recall (an episode is detected when a ``training_straggler`` alert of that
worker starts between its first sample and 60 s after its last), alert precision (an alert is
right when it starts inside or up to 60 s after an episode or a below-the-bar run of that worker),
time to detect (alert start minus episode start), and the same per worker; then the totals over
all jobs.

``step_time_regression`` is judged by the same written rule on the job's own step time, the median
over its workers at each sample (what the rule itself reads), against its own level (the median of
its last 30 samples below 1.15 of it): a regression episode is a run at 1.15 or more lasting 60 s
or longer; shorter runs and runs at 1.10 are real but not required. The job's step time is read
from its workers, so a worker's straggler episode moves it by that worker's weight in the median
(on a job whose workers run at two speeds the median sits on one worker): a step-time alert that
starts during a worker's slowdown (an episode, and its runs at 1.10 that overlap it, up to 60 s
after) is that slowdown's knock-on, explained but not required, as ``sim-eval`` counts an alert on
the faulty job. The BLOOM chronicles cannot be
scored this way: their iteration lines are excerpts of at most 12 consecutive iterations (one is
the slow-GPU drop, +5.6 %, under the bar), shorter than the rule's baseline; eval_real_traces.py
runs them with excerpt-sized windows.

``--legacy`` also prints the previous straggler rule (1.15x the first-20 % ratio to the plain
median for 3 samples, lone workers included). Jobs 3 and 4 of the same public set are not in
../shared/data; ``--data DIR`` scores a folder that has them.

usage: python eval/eval_replay_traces.py [--data DIR] [--legacy]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datapath import data_dir

from gpuscope.simeval.replay import replay_document

RATIO, NEAR, MIN_SECONDS, NEAR_SAMPLES, GRACE, MIN_WORKERS, LEARN = 1.15, 1.10, 60.0, 3, 60.0, 3, 30
HEALTHY_SHARE = 0.2  # the previous rule's healthy period
Times = dict[int, dict[int, float]]  # sample time -> worker -> mini-batch time


@dataclass(frozen=True, slots=True)
class Run:
    start: float
    end: float
    must: bool  # an episode (recall counts it); otherwise a run below the bar (precision allows it)


def _runs(flags: list[bool]) -> list[tuple[int, int, int]]:
    """(first index, last index, length) of each run of true flags; one false sample between two
    true ones does not end a run (a straggler has its better moments)."""
    out: list[tuple[int, int, int]] = []
    start = last = -1
    for i, f in enumerate(flags):
        if not f:
            continue
        if start >= 0 and i - last > 2:
            out.append((start, last, last - start + 1))
            start = -1
        if start < 0:
            start = i
        last = i
    if start >= 0:
        out.append((start, last, last - start + 1))
    return out


Fresh = dict[int, dict[int, bool]]  # worker -> sample -> a new reading (not a copy of its last)


def fresh(times: Times) -> Fresh:
    """Worker -> sample -> whether its value is a new reading: one equal to the worker's previous
    sample is that reading logged again (samples with at least 3 workers, as the rule reads)."""
    out: Fresh = defaultdict(dict)
    last: dict[int, float] = {}
    for s in sorted(times):
        if len(times[s]) < MIN_WORKERS:
            continue
        for w, t in times[s].items():
            out[w][s] = t != last.get(w)
            last[w] = t
    return out


def paces(times: Times, new: Fresh | None = None) -> dict[int, dict[int, float]]:
    """Worker -> sample -> its pace against its peers (samples with at least 3 workers).

    A worker's level is the median of its last ``LEARN`` times below ``RATIO`` of it, over the
    job-wide factor (the median over the workers of their time over their level; the first
    ``LEARN`` samples seed each level): a slowdown never becomes its own reference, a worker that
    gets faster or drifts slowly sets a new one. With ``new``, each reading counts once in a
    level (copies are left out of it); without, every sample does (the third round's rule)."""
    samples = [s for s in sorted(times) if len(times[s]) >= MIN_WORKERS]

    def counts(w: int, s: int) -> bool:
        return new is None or new[w][s]

    first: dict[int, list[float]] = defaultdict(list)
    taken: dict[int, int] = defaultdict(int)
    for s in samples:
        for w, t in times[s].items():
            if taken[w] < LEARN:
                taken[w] += 1
                if counts(w, s):
                    first[w].append(t)
    seen = {w: deque(ts, maxlen=LEARN) for w, ts in first.items()}
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for s in samples:
        level = {w: float(np.median(seen[w])) for w in times[s]}
        common = float(np.median([t / level[w] for w, t in times[s].items()]))
        for w, t in times[s].items():
            out[w][s] = t / common / level[w]
            if out[w][s] < RATIO and counts(w, s):
                seen[w].append(t / common)
    return out


def _own(values: list[tuple[int, float]]) -> dict[int, float]:
    """A series against its own level, learned as for workers (no peers)."""
    seen = deque((v for _, v in values[:LEARN]), maxlen=LEARN)
    out = {}
    for s, v in values:
        out[s] = v / float(np.median(seen))
        if out[s] < RATIO:
            seen.append(v)
    return out


def _episodes(pace: dict[int, float], interval: float, new: dict[int, bool] | None = None) -> list[Run]:
    """Episodes (``must``) and below-the-bar runs of one series. With ``new`` (sample -> a new
    reading), an episode also needs ``NEAR_SAMPLES`` new readings at the bar, and a run below it
    its shortest length in new readings; without, every sample is a reading."""
    ss = sorted(pace)
    need = max(NEAR_SAMPLES, int(np.ceil(MIN_SECONDS / interval)))
    runs = []
    for level, shortest in ((RATIO, 2), (NEAR, NEAR_SAMPLES)):
        slow = [pace[s] >= level for s in ss]
        for a, b, n in _runs(slow):
            readings = n if new is None else sum(slow[i] and new[ss[i]] for i in range(a, b + 1))
            if readings >= shortest:
                # slow while its level was being learned: a placement, or no healthy pace yet
                learned = a >= LEARN
                must = level == RATIO and n >= need and readings >= NEAR_SAMPLES and learned
                runs.append(Run(ss[a], ss[b] + interval, must))
    return runs


def truth(times: Times, interval: float, readings: bool = True) -> dict[int, list[Run]]:
    """Worker -> its straggler episodes and below-the-bar runs, by the written rule (``readings``:
    each reading counts once; otherwise the third round's rule, every sample a reading)."""
    new = fresh(times) if readings else None
    return {
        w: _episodes(pace, interval, None if new is None else new[w]) for w, pace in paces(times, new).items()
    }


def job_truth(times: Times, interval: float) -> list[Run]:
    """The job's own step-time regressions: its median time against its own healthy level."""
    samples = [s for s in sorted(times) if len(times[s]) >= MIN_WORKERS]
    median = [(s, float(np.median(list(times[s].values())))) for s in samples]
    return _episodes(_own(median), interval) if median else []


def legacy_truth(times: Times) -> set[int]:
    """The previous written rule: workers at 1.15x their first-20 % ratio to the median for 3 samples."""
    samples = sorted(times)
    healthy = samples[: max(1, int(HEALTHY_SHARE * len(samples)))]
    workers = sorted({w for s in samples for w in times[s]})
    median = {s: float(np.median(list(times[s].values()))) for s in samples}
    base = {
        w: float(np.median([times[s][w] / median[s] for s in healthy if w in times[s]] or [1.0]))
        for w in workers
    }
    slow = set()
    for w in workers:
        flags = [times[s].get(w, 0.0) / median[s] >= RATIO * base[w] for s in samples]
        if any(n >= NEAR_SAMPLES for _, _, n in _runs(flags)):
            slow.add(w)
    return slow


def _ratio(hit: int, total: int) -> str:
    return f"{hit / total:.2f} ({hit}/{total})" if total else "n/a"


Firing = dict[str, list[tuple[float, float]]]  # entity -> (started, resolved or infinity) of its alerts


def score(runs: dict[str, list[Run]], alerts: Firing, knock_ons: list[Run] | None = None) -> dict[str, Any]:
    """Episode recall, alert precision and time to detect for one rule over entities.

    An episode is detected by an alert of its entity that fires at some time between its start
    and ``GRACE`` after its end (one that already fired for an earlier episode counts, with a
    time to detect of 0); an alert is right when it starts inside, or up to ``GRACE`` after, any
    run of its entity, required or not, or any of ``knock_ons`` (runs of another rule that
    explain it)."""
    episodes = [(k, r) for k, rs in runs.items() for r in rs if r.must]
    detected, ttd, missed = 0, [], []
    for key, run in episodes:
        starts = [a for a, b in alerts.get(key, []) if a <= run.end + GRACE and b >= run.start]
        if starts:
            detected += 1
            ttd.append(max(0.0, min(starts) - run.start))
        else:
            missed.append(f"{key} {run.start:.0f}-{run.end:.0f} s")
    fired = [(k, t) for k, spans in alerts.items() for t, _ in spans]
    right = sum(
        any(r.start <= t <= r.end + GRACE for r in [*runs.get(k, []), *(knock_ons or [])]) for k, t in fired
    )
    must = {k for k, r in episodes}
    flagged = set(alerts)
    return {
        "counts": (detected, len(episodes), right, len(fired)),
        "episodes": len(episodes),
        "recall": _ratio(detected, len(episodes)),
        "alerts": len(fired),
        "precision": _ratio(right, len(fired)),
        "ttd": f"{np.median(ttd):.0f} / {max(ttd):.0f} s" if ttd else "-",
        "workers": f"truth {sorted(must)}, flagged {sorted(flagged)}, "
        f"false {sorted(k for k in flagged if not any(True for _ in runs.get(k, [])))}",
        "missed": missed,
    }


def _span(alert: dict[str, Any]) -> tuple[float, float]:
    end = alert["resolved_at"]
    return float(alert["started_at"]), math.inf if end is None else float(end)


def load(path: Path) -> Times:
    times: Times = defaultdict(dict)
    with path.open() as f:
        for row in csv.DictReader(f):
            times[int(row["time"])][int(row["worker"])] = float(row["batch_time_norm"])
    return times


Totals = dict[str, list[int]]  # rule -> [episodes detected, episodes, alerts right, alerts]


def evaluate(path: Path, workdir: Path, legacy: bool, totals: Totals) -> None:
    times = load(path)
    samples = sorted(times)
    interval = float(np.median(np.diff(samples))) if len(samples) > 1 else 1.0
    job = path.stem
    replay_csv = workdir / f"{job}.csv"
    with replay_csv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "job", "rank", "step", "node", "gpu", "step_seconds"])
        for s in samples:
            for worker, seconds in sorted(times[s].items()):
                w.writerow([s, job, worker, s, f"worker-{worker}", 0, seconds])
    doc = replay_document(replay_csv)
    stragglers: Firing = defaultdict(list)
    step_time: Firing = defaultdict(list)
    for a in doc["alerts"]:
        if a["rule"] == "training_straggler":
            stragglers[a["entity"]["rank"]].append(_span(a))
        elif a["rule"] == "step_time_regression":
            step_time[job].append(_span(a))
    others = sorted({a["rule"] for a in doc["alerts"]} - {"training_straggler", "step_time_regression"})
    workers = {str(w): runs for w, runs in truth(times, interval).items()}
    by_samples = {str(w): runs for w, runs in truth(times, interval, readings=False).items()}
    world = len({w for by in times.values() for w in by})
    print(
        f"{job}: {len(samples)} samples every {interval:.0f} s x {world} workers, "
        f"{doc['records']} records, {len(doc['refused'])} refused"
    )
    # the job's step time is read from its workers, so a worker's straggler episode moves it by
    # that worker's weight in the median: a step-time alert during that slowdown (the episode and
    # the run at 1.10 around it) is its knock-on, as sim-eval counts an alert on the faulty job:
    # explained, never required (the job's step time is a median over every worker's latest
    # reading at each sample, so its rule and its knock-ons count samples, as before)
    knock_ons = [
        r
        for rs in by_samples.values()
        for r in rs
        if any(e.must and e.start <= r.end and r.start <= e.end for e in rs)
    ]
    for rule, runs, alerts, explained in (
        ("training_straggler", workers, stragglers, None),
        ("training_straggler, samples rule", by_samples, stragglers, None),
        ("step_time_regression", {job: job_truth(times, interval)}, step_time, knock_ons),
    ):
        got = score(runs, alerts, explained)
        total = totals.setdefault(rule, [0, 0, 0, 0])
        for i, n in enumerate(got["counts"]):
            total[i] += n
        print(
            f"  {rule}: episodes {got['episodes']}, recall {got['recall']}, alerts {got['alerts']}, "
            f"precision {got['precision']}, TTD p50 / max {got['ttd']}; {got['workers']}"
        )
        if got["missed"]:
            print(f"    missed: {', '.join(got['missed'])}")
    if legacy:
        old = {str(w) for w in legacy_truth(times)}
        hit = len(old & set(stragglers))
        print(
            f"  legacy rule: truth {sorted(old)}, flagged {sorted(stragglers)}, "
            f"recall {_ratio(hit, len(old))}, precision {_ratio(hit, len(stragglers))}"
        )
    print(f"  other rules raised: {others or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=data_dir(), help="see eval/datapath.py")
    parser.add_argument("--legacy", action="store_true", help="also score the previous written rule")
    args = parser.parse_args()
    folder = args.data / "alibaba_v2020_minibatch_time"
    if not folder.is_dir():
        print(f"SKIP: no per-worker traces under {args.data}")
        return 0
    totals: Totals = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(folder.glob("job_*.csv")):
            evaluate(path, Path(tmp), args.legacy, totals)
    for rule, (hit, episodes, right, fired) in totals.items():
        print(f"all jobs, {rule}: recall {_ratio(hit, episodes)}, precision {_ratio(right, fired)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
