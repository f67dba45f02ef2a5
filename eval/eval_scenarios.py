"""The whole scenario suite, healthy day included: recall, precision, time to detect, false P1/P2 rate.

``make test`` runs the faulty scenarios and one healthy hour; this runs everything in
``tests/scenarios`` (24 simulated healthy hours and the long runs of ``long/`` among them) through
``sim-eval``'s runner and prints one row per scenario and the totals the budgets are about.

usage: python eval/eval_scenarios.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuscope.sim.scenario import load_scenario
from gpuscope.simeval.report import evaluate
from gpuscope.simeval.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent / "tests" / "scenarios"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    args = parser.parse_args()
    paths = [*sorted(ROOT.glob("*.yaml")), *sorted((ROOT / "healthy").glob("*.yaml"))]
    paths += sorted((ROOT / "long").glob("*.yaml"))  # evaluation only: too long for make test
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    faults = detected = alerts = unexplained = 0
    false_p1p2 = 0
    healthy_hours = 0.0
    ttd: list[float] = []
    print(
        f"{'scenario':<18} {'faults':>6} {'found':>5} {'alerts':>6} {'unexpl':>6} "
        f"{'P1/P2 FA':>8} {'speed':>7}"
    )
    for path in paths:
        scenario = load_scenario(path)
        started = time.perf_counter()
        result = run_scenario(scenario)
        wall = time.perf_counter() - started
        report = evaluate(scenario, result.told)
        found = sum(o.alert_id is not None for o in report.outcomes)
        faults += len(report.outcomes)
        detected += found
        alerts += report.alerts
        unexplained += len(report.unexplained)
        false_p1p2 += len(report.false_p1p2)
        healthy_hours += report.healthy_gpu_hours
        ttd += report.ttd_hard
        for o in report.outcomes:
            if o.alert_id is None:
                print(f"  MISSED {o.fault.kind} at {o.fault.at} {o.fault.target}")
        for a in report.unexplained:
            print(f"  UNEXPLAINED {a.severity} {a.rule} at {a.started_at} {a.entity}")
        print(
            f"{scenario.name:<18} {len(report.outcomes):>6} {found:>5} {report.alerts:>6} "
            f"{len(report.unexplained):>6} {len(report.false_p1p2):>8} {scenario.duration / wall:>6.0f}x"
        )
    ttd.sort()
    p50 = ttd[len(ttd) // 2] if ttd else None
    p95 = ttd[min(len(ttd) - 1, int(0.95 * len(ttd)))] if ttd else None
    recall = detected / faults if faults else 1.0
    precision = (alerts - unexplained) / alerts if alerts else 1.0
    rate = 1000 * false_p1p2 / healthy_hours if healthy_hours else 0.0
    print(
        f"recall {recall:.3f} ({detected}/{faults})  precision {precision:.3f}  "
        f"hard TTD p50 {p50} s p95 {p95} s  "
        f"false P1/P2 {false_p1p2} over {healthy_hours:.0f} healthy GPU-hours ({rate:.2f} per 1,000)"
    )


if __name__ == "__main__":
    main()
