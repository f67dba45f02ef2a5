"""GPU-hours per state measured by the hub's productivity model vs the simulator's ground truth.

Runs every scenario of the suite (``src/gpuscope/sim/scenarios`` and ``tests/scenarios``, healthy
ones included) through ``sim-eval``'s runner and prints, per scenario, the largest error of any
state as a percentage of the scenario's GPU-hours, then the pooled figure per state.

usage: python eval/eval_gpu_hours.py [--only NAME ...] [--skip NAME ...] [--jobs N]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpuscope.productivity.states import STATES
from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.gpu_hours import compare
from gpuscope.simeval.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent
SUITES = (ROOT / "src" / "gpuscope" / "sim" / "scenarios", ROOT / "tests" / "scenarios")


def _one(path: Path) -> tuple[str, dict[str, float], dict[str, float], float]:
    started = time.perf_counter()
    result = run_scenario(load_scenario(path))
    return path.stem, result.measured_gpu_hours, result.true_gpu_hours, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--skip", nargs="*", default=[], help="scenario names to leave out")
    parser.add_argument("--jobs", type=int, default=1, help="scenarios run at once")
    args = parser.parse_args()
    paths = [p for suite in SUITES for p in sorted(suite.rglob("*.yaml"))]
    paths = [p for p in paths if (not args.only or p.stem in args.only) and p.stem not in args.skip]
    paths.sort(key=lambda p: load_scenario(p).duration)  # short ones first: figures come early
    pooled_true: dict[str, float] = defaultdict(float)
    pooled_measured: dict[str, float] = defaultdict(float)
    worst = 0.0
    print(f"{'scenario':<18} {'GPU-h':>8} {'max err %':>9} {'worst state':<20} {'wall s':>7}", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for name, measured, true, wall in pool.map(_one, paths):
            cmp = compare(measured, true)
            state = max(cmp["states"], key=lambda s: cmp["states"][s]["error_pct"])
            worst = max(worst, cmp["max_error_pct"])
            hours, err = cmp["total_gpu_hours"], cmp["max_error_pct"]
            print(f"{name:<18} {hours:>8.2f} {err:>9.2f} {state:<20} {wall:>7.1f}", flush=True)
            for s in STATES:
                pooled_true[s] += true.get(s, 0.0)
                pooled_measured[s] += measured.get(s, 0.0)
    pooled = compare(pooled_measured, pooled_true)
    print(f"\n{'state':<20} {'true GPU-h':>11} {'measured':>11} {'error %':>8}")
    for s, row in pooled["states"].items():
        print(f"{s:<20} {row['true']:>11.3f} {row['measured']:>11.3f} {row['error_pct']:>8.3f}")
    print(f"\nworst scenario/state error: {worst:.2f} % of its GPU-hours")
    print(f"pooled over the suite: {pooled['max_error_pct']:.3f} % of all GPU-hours")


if __name__ == "__main__":
    main()
