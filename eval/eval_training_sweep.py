"""A sweep of training shapes the scenario suite lacks, for the straggler and step-time rules.

Two kinds of job, several seeds each:

* **per-worker logs** (the real traces' shape: each worker reports its own step time, no collective
  timing), written as ``gpuscope replay`` CSV and fed through the hub as ``replay`` does: stragglers
  at 1.15x, 1.2x and 1.3x on workers with 2, 5 and 10 % noise per reading; 7 of 16 and 8 of 16
  workers slowing at once; three speed groups with a straggler in the middle and in the slowest one;
  a two-speed job whose fast group gets a straggler; jobs of 4 and 64 workers; a healthy job whose
  warm-up starts at twice its pace; healthy jobs with an eval or checkpoint pause (every 50 or 100
  steps one step 3-5x longer, on every worker or on rank 0 only), one with a straggler too; a
  job-wide 1.2x regression; healthy jobs with 10 % noise, and the 1.15/1.2/1.3x stragglers on
  them, with and without 40 % repeated readings (as the real logs repeat them). Each with a
  reading every second and every 10 s.
* **simulated jobs** (``--sim``: scenario files, DESIGN §4, through ``sim-eval``'s runner; ranks
  report their arrival lag at the collective): stragglers at 1.15/1.2/1.3x; 7 of 16 then 8 of 16
  ranks slowing; 2 of 4; three speeds (two ``slow_placement`` groups) with stragglers in the middle
  and the fast group; a job whose fast group is the minority (4 of 16) with a straggler in it; a
  10-s step; 4 and 64 ranks; checkpoints every minute.

Per-worker scoring (``eval/episodes.py``): an injected slowdown is detected when a
``training_straggler`` alert of its worker starts between its start and 60 s after its end; a
straggler alert anywhere else is false;
``step_time_regression`` alerts count as false on the healthy shapes only (where ranks slow down the
job's median moves with them, a knock-on); "alerts per slowdown" is the most alerts one slowdown
raised (1 is one page); TTD is also given for the 1-s and the 10-s logs apart. Simulated jobs are
scored by ``sim-eval --report``'s rules. Results and what they showed are in docs/scenarios.md
("Issue 18, seventh round" and after).

``--trace`` prints, for each straggler verdict of the per-worker logs, the rank's state at the step
it was flagged: the clause that sustained it (``new5``: 5 new readings, ``30s``: 30 s with 3 new,
``short``: the short window), the long window's rise over its normal and its bar, the evidence and
its bar, the steps, new readings and telling readings (``_telling``) of the run, how long its
smoothed lag has been half way to its bars and whether the verdict needed that time (``sure``: it
did not), the spread, and the rank's last 12 readings.

usage: python eval/eval_training_sweep.py [--seeds 1,2] [--only SUBSTRING ...] [--sim] [--trace]
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from episodes import Tally, tally

from gpuscope.detect.ranks import RankDetector
from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.replay import replay_document
from gpuscope.simeval.report import evaluate
from gpuscope.simeval.runner import run_scenario

GRACE = 60.0
Slowdown = tuple[list[int], float, float, float]  # workers, start, end, factor
Row = tuple[float, str, int, int, str, str, str]


@dataclass(slots=True)
class Shape:
    workers: int = 16
    every: float = 1.0
    duration: float = 1500.0
    noise: float = 0.04
    levels: list[float] | None = None
    slow: list[Slowdown] = field(default_factory=list)
    job_slow: list[tuple[float, float, float]] = field(default_factory=list)
    pause: tuple[int, float, float, list[int] | None] | None = None  # every n steps, 3-5x, on whom
    ramp: tuple[float, float] | None = None  # warm-up: first steps this many times slower, decay (s)
    repeat: float = 0.0  # share of readings that repeat the previous one

    def healthy(self) -> bool:
        return not self.slow and not self.job_slow


def rows(name: str, seed: int, shape: Shape) -> list[Row]:
    """One reading per worker every ``shape.every`` seconds."""
    rng = np.random.default_rng(seed)
    n = shape.workers
    levels = np.asarray(shape.levels if shape.levels is not None else 1.0 + 0.03 * rng.standard_normal(n))
    out: list[Row] = []
    last = np.full(n, np.nan)
    for i in range(int(shape.duration / shape.every)):
        t = (i + 1) * shape.every
        now = levels * np.exp(shape.noise * rng.standard_normal(n))
        if shape.ramp:
            now *= 1.0 + (shape.ramp[0] - 1.0) * np.exp(-t / shape.ramp[1])
        for ranks, a, b, factor in shape.slow:
            if a <= t < b:
                now[ranks] *= factor
        for a, b, factor in shape.job_slow:
            if a <= t < b:
                now *= factor
        if shape.pause and i % shape.pause[0] == shape.pause[0] - 1:
            who = shape.pause[3] if shape.pause[3] is not None else list(range(n))
            now[who] *= rng.uniform(shape.pause[1], shape.pause[2])
        same = (rng.random(n) < shape.repeat) & np.isfinite(last)
        now[same] = last[same]
        last = now
        out += [(t, name, r, i + 1, f"n{r // 8}", str(r % 8), f"{now[r]:.5f}") for r in range(n)]
    return out


def shapes() -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    for every, duration in ((1.0, 1500.0), (10.0, 4000.0)):
        a, b = (600.0, 900.0) if every == 1.0 else (1500.0, 2100.0)
        tag = f"{every:g}s"
        for noise in (0.02, 0.05, 0.10):
            for factor in (1.15, 1.2, 1.3):
                out[f"straggler-{factor}x-noise{noise:.0%}-{tag}"] = Shape(
                    every=every, duration=duration, noise=noise, slow=[([5], a, b, factor)]
                )
        out[f"seven-of-16-{tag}"] = Shape(
            every=every, duration=duration, slow=[(list(range(2, 9)), a, b, 1.25)]
        )
        out[f"eight-of-16-{tag}"] = Shape(
            every=every, duration=duration, slow=[(list(range(8, 16)), a, b, 1.3)]
        )
        three = [1.0] * 6 + [1.3] * 5 + [1.7] * 5
        late = (b + (b - a) / 2, b + 3 * (b - a) / 2)
        out[f"three-speeds-{tag}"] = Shape(
            every=every,
            duration=duration,
            levels=three,
            slow=[([8], a, b, 1.25), ([13], late[0], late[1], 1.2)],
        )
        two = [1.0] * 8 + [1.35] * 8
        out[f"two-speeds-fast-straggler-{tag}"] = Shape(
            every=every, duration=duration, levels=two, slow=[([2], a, b, 1.2)]
        )
        for n in (4, 64):
            out[f"{n}-workers-{tag}"] = Shape(
                every=every, duration=duration, workers=n, slow=[([n // 2 + 1], a, b, 1.2)]
            )
        out[f"healthy-warm-up-ramp-{tag}"] = Shape(every=every, duration=duration, ramp=(2.0, 120.0 * every))
        for steps in (50, 100):
            out[f"healthy-pause-every-{steps}-{tag}"] = Shape(
                every=every, duration=duration, pause=(steps, 3.0, 5.0, None)
            )
            out[f"healthy-pause-rank0-every-{steps}-{tag}"] = Shape(
                every=every, duration=duration, pause=(steps, 3.0, 5.0, [0])
            )
        out[f"pause-and-straggler-{tag}"] = Shape(
            every=every, duration=duration, pause=(50, 3.0, 5.0, None), slow=[([5], a, b, 1.2)]
        )
        out[f"job-regression-{tag}"] = Shape(every=every, duration=duration, job_slow=[(a, b, 1.2)])
        out[f"healthy-noise10%-{tag}"] = Shape(every=every, duration=duration, noise=0.10)
        out[f"healthy-noise10%-repeats-{tag}"] = Shape(every=every, duration=duration, noise=0.10, repeat=0.4)
        for factor in (1.15, 1.2, 1.3):
            out[f"straggler-{factor}x-noise10%-repeats-{tag}"] = Shape(
                every=every, duration=duration, noise=0.10, repeat=0.4, slow=[([5], a, b, factor)]
            )
    return out


@dataclass(slots=True)
class Score:
    stragglers: Tally = field(default_factory=Tally)  # the injected slowdowns, by training_straggler
    step_false: int = 0
    step_found: int = 0  # job-wide regressions found by step_time_regression
    step_slowdowns: int = 0

    def add(self, other: Score) -> None:
        self.stragglers.add(other.stragglers)
        self.step_false += other.step_false
        self.step_found += other.step_found
        self.step_slowdowns += other.step_slowdowns


def score(shape: Shape, alerts: list[dict[str, Any]]) -> Score:
    stragglers = [
        (int(a["entity"]["rank"]), a["started_at"]) for a in alerts if a["rule"] == "training_straggler"
    ]
    episodes = [(r, a, b) for ranks, a, b, _ in shape.slow for r in ranks]
    out = Score(tally(stragglers, episodes, GRACE))
    if shape.healthy():
        out.step_false = sum(a["rule"] == "step_time_regression" for a in alerts)
    regressions = [x for x in alerts if x["rule"] == "step_time_regression"]
    for a, b, _ in shape.job_slow:
        out.step_slowdowns += 1
        out.step_found += any(a <= x["started_at"] <= b + GRACE for x in regressions)
    return out


def trace_verdicts() -> None:
    """Print each straggler verdict with the evidence it rested on (``--trace``)."""
    judge = RankDetector._judge
    readings: dict[int, list[float]] = {}

    def traced(
        self: RankDetector,
        job: Any,
        rank_ids: list[int],
        raw: Any,
        additive: bool,
        ts: float,
        only: set[int] | None = None,
    ) -> None:
        before = {r: s.flagged for r, s in job.ranks.items()}
        judge(self, job, rank_ids, raw, additive, ts, only)
        for r, x in zip(rank_ids, raw.tolist(), strict=True):
            state = job.ranks.get(r)
            if state is None or (only is not None and r not in only):
                continue
            last = readings.setdefault(id(state), [])
            last[:] = [*last[-11:], x]
            if not state.flagged or before.get(r, False):
                continue
            long_bar, _ = self._bars(state, additive)
            if self._sustained(state, ts):
                clause = "new5" if state.new_hits >= self.sustain else "30s"
            else:
                clause = "short" if self._short_slow(state) else "held"
            rise = self._rise(state.lag, state.lag_base, additive)
            print(
                f"  verdict at {ts:.0f} s, rank {r}: {clause}, long window {rise:+.3f} (bar {long_bar:.3f}), "
                f"evidence {state.evidence:.3f} (bar {self._evidence_bar(state):.3f}), "
                f"{state.lag_hits} steps / {state.new_hits} new / {state.told} telling, "
                f"half way for {ts - state.near_since:.0f} s, "
                f"sure {state.sure}, spread {state.lag_spread:.3f}, "
                f"readings {[round(v, 3) for v in last]}",
                flush=True,
            )

    RankDetector._judge = traced  # type: ignore[method-assign]


def _ttd(values: list[float]) -> str:
    return f"{np.median(values):.0f} / {max(values):.0f} s" if values else "-"


def replay_sweep(seeds: list[int], only: list[str]) -> None:
    total = Score()
    # 1-s logs are found in about 10 s and 10-s logs in 40 s or more: the pooled median sits at the
    # gap between them and jumps when one detection is added on either side, so each is said apart
    by_every: dict[float, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in shapes().items():
            if only and not any(o in name for o in only):
                continue
            for seed in seeds:
                path = Path(tmp) / f"{name}-s{seed}.csv"
                with path.open("w", newline="") as f:
                    out = csv.writer(f)
                    out.writerow(["ts", "job", "rank", "step", "node", "gpu", "step_seconds"])
                    out.writerows(rows(name, seed, shape))
                s = score(shape, replay_document(path)["alerts"])
                total.add(s)
                t = s.stragglers
                by_every.setdefault(shape.every, []).extend(t.ttd)
                ttd = f"{np.median(t.ttd):.0f} s" if t.ttd else "-"
                print(
                    f"{name} seed {seed}: found {t.found}/{t.episodes}, straggler alerts {t.alerts}, "
                    f"false {t.false}, most alerts for one slowdown {t.most}, TTD p50 {ttd}, "
                    f"false step-time alerts {s.step_false}"
                    + (
                        f", job regressions found {s.step_found}/{s.step_slowdowns}"
                        if s.step_slowdowns
                        else ""
                    ),
                    flush=True,
                )
    each = ", ".join(f"{_ttd(v)} on {every:g}-s logs" for every, v in sorted(by_every.items()))
    t = total.stragglers
    print(
        f"per-worker logs: found {t.found}/{t.episodes}, straggler alerts {t.alerts}, "
        f"false {t.false}, most alerts for one slowdown {t.most}, "
        f"TTD p50 / max {_ttd(t.ttd)} ({each}), "
        f"false step-time alerts on healthy shapes {total.step_false}, "
        f"job regressions found {total.step_found}/{total.step_slowdowns}"
    )


def _straggler(at: float, job: str, rank: int, slowdown: float, duration: float) -> str:
    return (
        f"  - {{at: {at:g}, kind: straggler, target: {{job: {job}, rank: {rank}}}, "
        f"params: {{slowdown: {slowdown}}}, duration: {duration:g}}}"
    )


def _placement(job: str, first: int, ranks: int, slowdown: float) -> str:
    return (
        f"  - {{at: 0, kind: slow_placement, target: {{job: {job}}}, "
        f"params: {{first_rank: {first}, ranks: {ranks}, slowdown: {slowdown}}}}}"
    )


def _job(name: str, nodes: range, step: float = 1.0, extra: str = "", checkpoint: int = 600) -> str:
    on = ", ".join(f"node-{n}" for n in nodes)
    return (
        f"  - {{name: {name}, kind: training, nodes: [{on}], step_time: {step}, "
        f"checkpoint_every: {checkpoint}{extra}}}"
    )


def scenarios(seed: int) -> dict[str, str]:
    def doc(name: str, duration: int, nodes: int, gpus: int, jobs: list[str], faults: list[str]) -> str:
        head = [f"name: {name}-s{seed}", f"seed: {seed}", f"duration: {duration}", "interval: 1"]
        head.append(f"cluster: {{nodes: {nodes}, gpus_per_node: {gpus}, gpu_model: H100-SXM5-80GB}}")
        return "\n".join([*head, "jobs:", *jobs, "faults:" + ("" if faults else " []"), *faults, ""])

    j16 = _job("j", range(4))
    return {
        "levels": doc(
            "levels",
            1800,
            4,
            4,
            [j16],
            [
                _straggler(300 + 500 * i, "j", r, f, 400)
                for i, (r, f) in enumerate(((3, 1.15), (9, 1.2), (14, 1.3)))
            ],
        ),
        "many": doc(
            "many",
            1800,
            5,
            4,
            [j16, _job("k", range(4, 5), 0.8)],
            [_straggler(400, "j", r, 1.2, 500) for r in range(1, 8)]
            + [_straggler(1100, "j", r, 1.3, 500) for r in range(8, 16)]
            + [_straggler(700, "k", r, 1.25, 500) for r in (1, 2)],
        ),
        "three-speeds": doc(
            "three-speeds",
            1800,
            4,
            4,
            [j16],
            [
                _placement("j", 8, 4, 1.2),
                _placement("j", 12, 4, 1.45),
                _straggler(700, "j", 9, 1.25, 400),
                _straggler(1300, "j", 1, 1.2, 400),
            ],
        ),
        "fast-minority": doc(
            "fast-minority",
            1500,
            4,
            4,
            [j16],
            [_placement("j", 4, 12, 1.3), _straggler(700, "j", 1, 1.2, 500)],
        ),
        "ten-second-steps": doc(
            "ten-second-steps",
            3000,
            4,
            4,
            [_job("j", range(4), 10.0)],
            [_straggler(700, "j", 5, 1.2, 800), _straggler(1900, "j", 11, 1.15, 800)],
        ),
        "sizes": doc(
            "sizes",
            1200,
            9,
            8,
            [_job("big", range(8)), _job("tiny", range(8, 9), extra=", gpus: [0, 1, 2, 3]")],
            [_straggler(500, "big", 40, 1.2, 500), _straggler(500, "tiny", 2, 1.2, 500)],
        ),
        "checkpoint-every-minute": doc(
            "checkpoint-every-minute",
            1500,
            4,
            4,
            [_job("j", range(4), extra=", checkpoint_seconds: 15", checkpoint=60)],
            [],
        ),
    }


def sim_sweep(seeds: list[int], only: list[str]) -> None:
    found = faults = alerts = unexplained = serious = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for name, text in scenarios(seed).items():
                if only and not any(o in name for o in only):
                    continue
                path = Path(tmp) / f"{name}-s{seed}.yaml"
                path.write_text(text)
                scenario = load_scenario(path)
                report = evaluate(scenario, run_scenario(scenario).told)
                hit = sum(o.alert_id is not None for o in report.outcomes)
                found, faults = found + hit, faults + len(report.outcomes)
                alerts, unexplained = alerts + report.alerts, unexplained + len(report.unexplained)
                serious += len(report.false_p1p2)
                missed = [
                    (o.fault.kind, o.fault.at, o.fault.target) for o in report.outcomes if o.alert_id is None
                ]
                print(
                    f"{name} seed {seed}: found {hit}/{len(report.outcomes)}, alerts {report.alerts}, "
                    f"unexplained {len(report.unexplained)}, false P1/P2 {len(report.false_p1p2)}"
                    + (f", missed {missed}" if missed else ""),
                    flush=True,
                )
    print(
        f"simulated jobs: found {found}/{faults}, alerts {alerts}, unexplained {unexplained}, "
        f"false P1/P2 {serious}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds")
    parser.add_argument("--only", nargs="*", default=[], help="shapes whose name contains one of these")
    parser.add_argument("--sim", action="store_true", help="the simulated jobs instead of per-worker logs")
    parser.add_argument("--trace", action="store_true", help="print the evidence at each straggler verdict")
    args = parser.parse_args()
    if args.trace:
        trace_verdicts()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.sim:
        sim_sweep(seeds, args.only)
    else:
        replay_sweep(seeds, args.only)


if __name__ == "__main__":
    main()
