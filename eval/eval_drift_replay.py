"""Model-quality drift without the rest of the hub: scenarios' sketches through the monitor and the rule.

``scenario`` mode plays each scenario's simulator and sends only its services' ``quality_sketch``
events through :class:`~gpuscope.quality.monitor.QualityMonitor` and
:class:`~gpuscope.detect.drift.DriftDetector` (what a hub does with them; the drift rule reads
nothing else), and prints per scenario the highest score per signal and feature, the rows at or
above the rule's material score, the longest weighted hold reached, the references cut short and
when each drift rule held. Minutes for a 6-hour day where ``sim-eval`` takes ten or more, so the
healthy days can be checked for a change of the monitor or the rule.

``window`` mode measures the monitor's early end of learning on the simulator's own sketches: how
often one healthy window is "far" from a healthy reference of a few windows (a false verdict), and
how often the first window of a drift of the default size is (a true one).

usage: python eval/eval_drift_replay.py scenario PATH.yaml ... [--series FEATURE]
       python eval/eval_drift_replay.py window [--draws 500]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gpuscope.detect.drift import DriftDetector
from gpuscope.model import Batch
from gpuscope.quality.monitor import QualityMonitor
from gpuscope.quality.sketch import Sketch, sketch_from_json
from gpuscope.sim import Simulator
from gpuscope.sim.quality import QualityConditions, ServiceQuality
from gpuscope.sim.scenario import load_scenario


def replay(path: Path, series: str | None) -> None:
    monitor, rule = QualityMonitor(), DriftDetector()
    top: dict[str, tuple[float, float]] = {}
    material: list[str] = []
    held: dict[str, float] = {}
    holding: dict[str, list[float]] = {}
    for tick in Simulator(load_scenario(path)).ticks():
        for batch in tick.sdk_batches:
            sketches = [e for e in batch.events if e.kind == "quality_sketch"]
            derived = monitor.observe(Batch(batch.source, events=sketches)) if sketches else None
            for frame in derived.frames if derived else []:
                rule.on_frame(frame)
                (metric,) = [m for m in frame.metrics if m.endswith("_drift_score")]
                score = float(frame.values[0, frame.metrics.index(metric)])
                name = f"{frame.entities[0].get('service')}/{frame.entities[0].get('feature')}"
                if score > top.get(name, (-1.0, 0.0))[0]:
                    top[name] = (score, frame.ts)
                if score >= rule.min_score:
                    material.append(f"{frame.ts:.0f} {name} {score:.3f}")
                if series is not None and name.endswith(f"/{series}"):
                    print(f"  {frame.ts:8.0f} {name} {score:.3f}")
        for finding in rule.evaluate(tick.t):
            holding.setdefault(f"{finding.rule} {finding.entity.get('service')}", []).append(tick.t)
        for service, state in rule._services.items():
            for (_, feature), f in state.features.items():
                key = f"{service}/{feature}"
                held[key] = max(held.get(key, 0.0), f.held if f.since is not None else 0.0)
    print(f"{path.stem}:")
    print("  highest score: " + ", ".join(f"{n} {s:.3f} at {t:.0f}" for n, (s, t) in sorted(top.items())))
    print(f"  rows >= {rule.min_score}: {len(material)} {material[:12]}")
    print(
        f"  longest weighted hold (of {rule.sustain:.0f} s): "
        + str({k: round(v) for k, v in held.items() if v})
    )
    print(f"  references cut short: {monitor.counters.get('quality_references_cut_short')}")
    print("  drift rules held: " + str({k: (v[0], v[-1]) for k, v in holding.items()}))


def windows(draws: int) -> None:
    rng = np.random.default_rng(0)
    quality = ServiceQuality(rng, 0.0, 0.0)
    monitor = QualityMonitor()

    def window(n: int, cond: QualityConditions, day: float = 1.0) -> dict[str, Sketch]:
        events = quality._sketches(0.0, n, day, {"service": "s"}, cond)
        return {e.labels["feature"]: sketch_from_json(e.data["sketch"]) for e in events}

    def reference(n: int, count: int) -> dict[str, Sketch]:
        ref = window(n, QualityConditions())
        for _ in range(count - 1):
            for feature, sk in window(n, QualityConditions()).items():
                ref[feature].merge(sk)  # type: ignore[arg-type]
        return ref

    shapes = ((30, 9), (60, 5), (100, 3), (200, 2), (400, 1))  # samples a window, windows learned
    print(f"healthy window far from a healthy reference (of {draws}):")
    for n, count in shapes:
        far: dict[str, int] = {}
        for _ in range(draws):
            ref, one = reference(n, count), window(n, QualityConditions(), day=rng.uniform(-1.0, 1.0))
            for feature, sk in one.items():
                far[feature] = far.get(feature, 0) + monitor._far(ref[feature], sk)
        print(f"  {n} a window, {count} learned: {far}")
    drifts = {
        "prediction_drift 0.3": QualityConditions(prediction_shift=0.3),
        "confidence_shift -0.8": QualityConditions(confidence_shift=-0.8),
        "input_drift 1.6": QualityConditions(input_factor=1.6),
    }
    tries = max(draws // 10, 1)
    print(f"first drifted window far from a healthy reference (of {tries}):")
    for label, cond in drifts.items():
        for n, count in shapes[1:]:
            far = {}
            for _ in range(tries):
                ref, one = reference(n, count), window(n, cond)
                for feature, sk in one.items():
                    far[feature] = far.get(feature, 0) + monitor._far(ref[feature], sk)
            print(f"  {label}, {n} a window, {count} learned: {far}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    play = sub.add_parser("scenario")
    play.add_argument("paths", nargs="+", type=Path)
    play.add_argument("--series", default=None, help="print every score of this feature")
    win = sub.add_parser("window")
    win.add_argument("--draws", type=int, default=500)
    args = parser.parse_args()
    if args.mode == "scenario":
        for path in args.paths:
            replay(path, args.series)
    else:
        windows(args.draws)


if __name__ == "__main__":
    main()
