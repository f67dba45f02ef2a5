"""A GPU slower than its job's other parts from the start: the ``slow_placement`` it raises, or not.

Uses the clocks of ``eval/eval_gpu_slow.py`` (16 GPUs of one model, part offsets, wander, reading
noise, 15-MHz bins, power blips) for 1200 s, long enough for every pace to be learned (the verdict
is taken once, then), and counts the ``slow_placement`` alerts of ``ClockDetector``:

* ``healthy``, ``two-speed-3``, ``two-speed-6``: no GPU is a planted slow part, so every
  placement names a part at the tail of the drawn spread (clipped at 2.5 sigma);
* ``plant-1.05`` / ``plant-1.03``: GPU 3 (node-0 GPU 3) runs 1.05x / 1.03x slower than its drawn
  part for the whole run: found when an alert names it (``--shapes`` takes any ``plant-F``:
  ``plant-1.12`` is a part past the own pace's 10 % bound, a faulty part: a P2
  ``gpu_underperforming`` and no placement).

Per planted GPU it says how it was raised: as a P3 placement, as a P2 ``gpu_underperforming``, or
both (one cause, two alerts); and it counts P1/P2 alerts of the other GPUs (there should be none),
and every ``gpu_underperforming`` and ``slow_placement`` of the other GPUs (``elsewhere``).

``--noise read10`` is the ``mid`` parts and wander with readings 10 % apart (one sigma per reading,
no ceiling: a throughput proxy, or clocks read through a noisy exporter); ``--every 10`` evaluates
once every 10 s, on that second's reading; ``--duration`` is the run in seconds (7200: 2 hours).

usage: python eval/eval_gpu_placement.py [--seeds 1,2,3,4,5] [--noise mid,high,read10]
    [--shapes healthy,plant-1.12] [--every 1] [--duration 1200]
"""

from __future__ import annotations

import argparse
import math

import eval_gpu_slow as slow
import numpy as np

slow.DURATION = 1200
PLANTED = ("node-0", "3")
SERIOUS = ("P1", "P2")
RULES = ("slow_placement", slow.RULE)
slow.NOISE["read10"] = (0.01, 0.004, 0.10)
CEILING = slow.MAX_MHZ


def run(
    shape: str, noise: str, seed: int, every: int = 1
) -> tuple[list[tuple[str, str, float]], set[str], int, int]:
    """The placements (node, GPU, lag), the tiers the planted GPU was raised at, the P1/P2 alerts
    of the other GPUs (of every GPU where none is planted) and their gpu_underperforming and
    slow_placement alerts."""
    name, _, factor = shape.partition("plant-")
    shapes = {s.name: s for s in slow.shapes()}
    slow.MAX_MHZ = math.inf if noise == "read10" else CEILING
    c = slow.clocks(shapes[name or "healthy"], noise, seed)
    if factor:
        planted = int(PLANTED[1])
        c.mhz[:, planted] = np.round(c.mhz[:, planted] / float(factor) / slow.BIN) * slow.BIN
    alerts = slow.play(c, slow.DURATION, every).all()
    placed = [
        (a.entity["node"], a.entity["gpu"], float(a.value or 0.0))
        for a in alerts
        if a.rule == "slow_placement"
    ]
    mine = [a for a in alerts if (a.entity.get("node"), a.entity.get("gpu")) == PLANTED]
    tiers = {a.severity for a in mine if a.rule in RULES}
    ours = {a.id for a in mine} if factor else set()
    others = sum(1 for a in alerts if a.severity in SERIOUS and a.id not in ours)
    elsewhere = sum(1 for a in alerts if a.rule in RULES and "gpu" in a.entity and a.id not in ours)
    return placed, tiers, others, elsewhere


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--noise", default="mid,high")
    parser.add_argument("--shapes", default="healthy,two-speed-3,two-speed-6,plant-1.05,plant-1.03")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--duration", type=int, default=slow.DURATION)
    args = parser.parse_args()
    slow.DURATION = args.duration
    seeds = [int(s) for s in args.seeds.split(",")]
    for noise in args.noise.split(","):
        for shape in args.shapes.split(","):
            placements = serious = elsewhere = 0
            raised: dict[str, int] = {"P3": 0, "P2": 0, "both": 0}
            for seed in seeds:
                placed, tiers, others, aside = run(shape, noise, seed, args.every)
                placements += len(placed)
                serious += others
                elsewhere += aside
                if tiers:
                    raised["both" if len(tiers) > 1 else min(tiers)] += 1
                for node, gpu, lag in placed:
                    print(f"  {noise} {shape} seed {seed}: {node} GPU {gpu} {lag:.1%}")
            found = sum(raised.values())
            how = f"P3 placement {raised['P3']}, P2 {raised['P2']}, both {raised['both']}"
            hit = f"found {found}/{len(seeds)} ({how})" if shape.startswith("plant") else ""
            print(
                f"{noise:6} every {args.every:2} s {shape:12} placements {placements:2} P1/P2 elsewhere "
                f"{serious} gpu alerts elsewhere {elsewhere} {hit}",
                flush=True,
            )


if __name__ == "__main__":
    main()
