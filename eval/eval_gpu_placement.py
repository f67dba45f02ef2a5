"""A GPU slower than its job's other parts from the start: the ``slow_placement`` it raises, or not.

Uses the clocks of ``eval/eval_gpu_slow.py`` (16 GPUs of one model, part offsets, wander, reading
noise, 15-MHz bins, power blips) for 1200 s, long enough for every pace to be learned (the verdict
is taken once, then), and counts the ``slow_placement`` alerts of ``ClockDetector``:

* ``healthy``, ``two-speed-3``, ``two-speed-6``: no GPU is a planted slow part, so every
  placement names a part at the tail of the drawn spread (clipped at 2.5 sigma);
* ``plant-1.05`` / ``plant-1.03``: GPU 3 (node-0 GPU 3) runs 1.05x / 1.03x slower than its drawn
  part for the whole run: found when a placement names it (``--shapes`` takes any ``plant-F``:
  ``plant-1.12`` is a part past the own pace's 10 % bound).

It also counts P1/P2 alerts (there should be none: a slow part from the start is no live fault).

usage: python eval/eval_gpu_placement.py [--seeds 1,2,3,4,5] [--noise mid,high] [--shapes healthy,plant-1.12]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

from gpuscope.alert.engine import AlertEngine
from gpuscope.detect.clocks import ClockDetector
from gpuscope.detect.engine import DetectionEngine

_SPEC = importlib.util.spec_from_file_location("eval_gpu_slow", Path(__file__).with_name("eval_gpu_slow.py"))
assert _SPEC is not None and _SPEC.loader is not None
slow = importlib.util.module_from_spec(_SPEC)
sys.modules["eval_gpu_slow"] = slow
_SPEC.loader.exec_module(slow)
slow.DURATION = 1200
PLANTED = 3


def run(shape: str, noise: str, seed: int) -> tuple[list[tuple[str, str, float]], int]:
    name, _, factor = shape.partition("plant-")
    shapes = {s.name: s for s in slow.shapes()}
    c = slow.clocks(shapes[name or "healthy"], noise, seed)
    if factor:
        c.mhz[:, PLANTED] = np.round(c.mhz[:, PLANTED] / float(factor) / slow.BIN) * slow.BIN
    detection = DetectionEngine([ClockDetector()])
    alerting = AlertEngine(resolve_after=5.0)
    for t in range(slow.DURATION):
        detection.observe_many(slow._batches(t, c))
        alerting.update(float(t), detection.evaluate(float(t)))
    placed = [
        (a.entity["node"], a.entity["gpu"], float(a.value or 0.0))
        for a in alerting.all()
        if a.rule == "slow_placement"
    ]
    return placed, sum(1 for a in alerting.all() if a.severity in ("P1", "P2"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--noise", default="mid,high")
    parser.add_argument("--shapes", default="healthy,two-speed-3,two-speed-6,plant-1.05,plant-1.03")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    for noise in args.noise.split(","):
        for shape in args.shapes.split(","):
            found = placements = serious = 0
            for seed in seeds:
                placed, p12 = run(shape, noise, seed)
                placements += len(placed)
                serious += p12
                found += any((node, gpu) == ("node-0", str(PLANTED)) for node, gpu, _ in placed)
                for node, gpu, lag in placed:
                    print(f"  {noise} {shape} seed {seed}: {node} GPU {gpu} {lag:.1%}")
            hit = f"found {found}/{len(seeds)}" if shape.startswith("plant") else ""
            print(f"{noise:5} {shape:12} placements {placements:2} P1/P2 {serious} {hit}", flush=True)


if __name__ == "__main__":
    main()
