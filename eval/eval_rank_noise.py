"""Healthy ranks with noisy step times: what the rank detector raises on its own noise.

16 ranks of one job, each reporting its own step time (``step_seconds``, 10 s) with ``--noise``
(10 %) reading noise, a share ``--repeat`` (none) of the readings repeating the rank's last one (a
logger that writes its last value again; the real 10-s logs repeat 28-49 %), one step every
``--every`` seconds for ``--duration`` seconds (2 hours), fed to
:class:`~gpuscope.detect.ranks.RankDetector` alone in virtual time (a new step opens a tenth of a
step after each, findings are taken a fifth of a step after).
Every rank is healthy, so every finding is false. Per seed it prints the P1/P2 findings (each new
``training_straggler`` of a rank is one alert; the rule is P2), the P3 ``slow_placement`` alerts,
and how many alerts lasted under 60 s (a flap by itself: nobody acts on a 2-s straggler), with the
start, length and rank of each. Results: docs/scenarios.md ("Issue 18, seventeenth round", and the
nineteenth for ``--repeat``).

usage: python eval/eval_rank_noise.py [--seeds 1,2,3] [--every 1,10] [--noise 0.1] [--duration 7200]
       [--repeat 0.4]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import numpy as np

from gpuscope.detect.ranks import RankDetector
from gpuscope.model import TrainingRecord
from gpuscope.rules import spec

RANKS, STEP, FLAP = 16, 10.0, 60.0


@dataclass(slots=True)
class Result:
    serious: int = 0  # P1/P2 alerts
    placements: int = 0
    #: (start, seconds, rank) of every alert
    alerts: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def short(self) -> int:
        return sum(seconds < FLAP for _, seconds, _ in self.alerts)


def run(seed: int, every: float, noise: float, duration: float, repeat: float = 0.0) -> Result:
    rng = np.random.default_rng(seed)
    detector, out = RankDetector(), Result()
    since: dict[tuple[str, str], float] = {}
    steps = int(duration / every)
    last = np.full(RANKS, np.nan)
    for k in range(steps + 1):
        ts = k * every
        now_times = STEP * (1.0 + noise * rng.standard_normal(RANKS))
        if repeat > 0:  # no draw otherwise: the readings of runs without repeats stay as they were
            same = (rng.random(RANKS) < repeat) & np.isfinite(last)
            now_times[same] = last[same]
        last = now_times
        # one more evaluation after the last step closes the alerts still open
        times: list[float] = now_times.tolist() if k < steps else []
        for rank, seconds in enumerate(times):
            labels = {"node": f"worker-{rank}", "gpu": "0"}
            detector.on_training(TrainingRecord(ts, "j", rank, k, {"step_seconds": seconds}, labels))
        detector.on_training(TrainingRecord(ts + 0.1 * every, "j", 0, k + 1, {}))
        now = ts + 0.2 * every
        live = {(f.rule, f.entity.get("rank", "")) for f in detector.evaluate(now)} if k < steps else set()
        for key in live - set(since):
            since[key] = now
            out.serious += spec(key[0]).tier in ("P1", "P2")
            out.placements += key[0] == "slow_placement"
        for key in set(since) - live:
            out.alerts.append((since[key], now - since.pop(key), key[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--every", default="1,10", help="comma-separated seconds between steps")
    parser.add_argument("--noise", type=float, default=0.10, help="reading noise, one sigma")
    parser.add_argument("--duration", type=float, default=7200.0, help="seconds")
    parser.add_argument("--repeat", type=float, default=0.0, help="share of readings repeating the last one")
    args = parser.parse_args()
    for every in (float(x) for x in args.every.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            r = run(seed, every, args.noise, args.duration, args.repeat)
            said = ", ".join(f"rank {rank} at {t:.0f} s for {s:.0f} s" for t, s, rank in r.alerts)
            print(
                f"every {every:g} s seed {seed}: P1/P2 {r.serious}, slow_placement {r.placements}, "
                f"alerts under {FLAP:.0f} s {r.short}/{len(r.alerts)}" + (f" ({said})" if said else "")
            )


if __name__ == "__main__":
    main()
