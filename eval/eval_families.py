"""Per rule family: recall, precision, time to detect, over the whole scenario suite; flapping too.

A family is the rule a fault kind is detected by (``gpuscope.sim.kinds``). Recall is the share of
a family's faults detected in their window; precision is the share of the family's alerts that a
fault explains (the detection itself or a knock-on in its blast radius, as ``sim-eval --report``
judges them); time to detect is the median and worst over detected faults. Also counted: P1/P2
alerts on the healthy scenarios, and, among the alerts no fault explains (the steady state),
those that resolve and fire again on the same entity more than twice within an hour (flapping).
``tests/scenarios/long`` (a day and more of simulated time) and the built-in 2- and 3-hour mixes
(``gpuscope sim-eval hardware-mix`` ...; ``make test`` only checks that the simulator plays them)
run too unless ``--short``.
``--json-dir`` writes each scenario's ``sim-eval --json`` document there, for outside scorers.

``--from-json DIR`` scores documents written earlier instead of simulating (the scenarios whose
document is missing are left out and named).

usage: python eval/eval_families.py [--only NAME ...] [--short] [--json-dir DIR | --from-json DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.model import Alert
from gpuscope.rules import RULES
from gpuscope.sim import builtin_scenario
from gpuscope.sim.scenario import Scenario, load_scenario
from gpuscope.simeval.report import Report, evaluate
from gpuscope.simeval.runner import alerts_json, run_scenario

ROOT = Path(__file__).resolve().parent.parent / "tests" / "scenarios"
MIXES = ("hardware-mix", "service-mix", "training-mix")


def flapping(alerts: list[Alert], per_hour: int = 2) -> list[str]:
    """Rule/entity pairs that started more than ``per_hour`` times again within any hour."""
    starts: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = defaultdict(list)
    for a in alerts:
        starts[(a.rule, tuple(sorted(a.entity.items())))].append(a.started_at)
    out = []
    for (rule, entity), ts in starts.items():
        ts.sort()
        refires = ts[1:]
        if any(sum(1 for u in refires if t <= u < t + 3600.0) > per_hour for t in refires):
            out.append(f"{rule} {dict(entity)} fired {len(ts)} times")
    return out


def from_document(doc: dict[str, object]) -> list[Alert]:
    """The alerts of a ``sim-eval --json`` document (DESIGN §5), as the scorer reads them."""
    rows = doc["alerts"]
    assert isinstance(rows, list)
    return [
        Alert(
            id=str(i),
            rule=a["rule"],
            severity=a["severity"],
            owner=RULES[a["rule"]].owner,
            entity=dict(a["entity"]),
            started_at=float(a["started_at"]),
            summary=a["summary"],
            cost_per_hour=float(a["cost_per_hour"]),
            resolved_at=a["resolved_at"],
            incident=a.get("incident"),
        )
        for i, a in enumerate(rows)
    ]


def play(scenario: Scenario, saved: Path | None, reuse: bool) -> tuple[list[Alert], str]:
    """The scenario's alerts and a note of the wall time: read from the ``sim-eval --json``
    document ``saved`` when ``reuse`` (and it exists), else simulated (and written there)."""
    if reuse and saved is not None and saved.exists():
        return from_document(json.loads(saved.read_text())), ""
    began = time.monotonic()
    result = run_scenario(scenario)
    wall = f", {time.monotonic() - began:.0f} s wall, load average {os.getloadavg()[0]:.1f}"
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(alerts_json(result)))
    return result.told, wall


@dataclass
class Tally:
    """Per family (rule): faults, detections, times to detect, alerts, alerts no fault explains;
    with the P1/P2 alerts of healthy scenarios and the steady state's flapping."""

    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    found: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ttd: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    fired: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stray: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    healthy_p1p2: list[str] = field(default_factory=list)
    flaps: list[str] = field(default_factory=list)

    def add(self, name: str, scenario: Scenario, alerts: list[Alert], report: Report) -> list[str]:
        """Count one scenario's run as ``sim-eval --report`` judged it; its missed faults and
        unexplained alerts, one line each."""
        notes = []
        for o in report.outcomes:
            self.faults[o.rule] += 1
            if o.time_to_detect is not None:
                self.found[o.rule] += 1
                self.ttd[o.rule].append(o.time_to_detect)
            else:
                notes.append(f"{name}: MISSED {o.fault.kind} at {o.fault.at} {o.fault.target}")
        for a in alerts:
            self.fired[a.rule] += 1
        for a in report.unexplained:
            self.stray[a.rule] += 1
            notes.append(f"{name}: UNEXPLAINED {a.severity} {a.rule} at {a.started_at:.0f} {a.entity}")
        if not scenario.faults:
            self.healthy_p1p2 += [f"{name} {a.rule}" for a in alerts if a.severity in ("P1", "P2")]
        self.flaps += [f"{name}: {f}" for f in flapping(report.unexplained)]  # steady state
        return notes

    def rows(self) -> list[str]:
        """The per-family table: a header and a line per rule."""
        head = ("faults", "recall", "alerts", "precision", "TTD p50", "max")
        out = [f"{'family (rule)':<30} " + " ".join(f"{h:>9}" for h in head)]
        for rule in sorted(set(self.faults) | set(self.fired)):
            n, hit, a = self.faults.get(rule, 0), self.found.get(rule, 0), self.fired.get(rule, 0)
            recall = f"{hit / n:.2f}" if n else "-"
            precision = f"{(a - self.stray.get(rule, 0)) / a:.2f}" if a else "-"
            times = self.ttd.get(rule, [])
            p50 = f"{statistics.median(times):.0f}" if times else "-"
            worst = f"{max(times):.0f}" if times else "-"
            out.append(f"{rule:<30} " + " ".join(f"{c:>9}" for c in (n, recall, a, precision, p50, worst)))
        return out

    def totals(self) -> str:
        tf, th = sum(self.faults.values()), sum(self.found.values())
        ta, ts = sum(self.fired.values()), sum(self.stray.values())
        recall, precision = th / max(tf, 1), (ta - ts) / max(ta, 1)
        return f"all: recall {recall:.3f} ({th}/{tf}), precision {precision:.3f} ({ta - ts}/{ta})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--json-dir", type=Path, default=None, help="write each sim-eval JSON here")
    parser.add_argument("--short", action="store_true", help="leave out tests/scenarios/long")
    parser.add_argument("--from-json", type=Path, default=None, help="score documents saved by --json-dir")
    args = parser.parse_args()
    paths = sorted(ROOT.glob("*.yaml")) + sorted((ROOT / "healthy").glob("*.yaml"))
    if not args.short:
        paths += sorted((ROOT / "long").glob("*.yaml")) + [builtin_scenario(name) for name in MIXES]
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    tally = Tally()
    for path in paths:
        scenario = load_scenario(path)
        # simulated results are deterministic; the wall time depends on the machine's load
        if args.from_json is not None:
            if not (args.from_json / f"{path.stem}.json").exists():
                print(f"  {scenario.name}: no saved document, left out")
                continue
            alerts, wall = play(scenario, args.from_json / f"{path.stem}.json", reuse=True)
        else:
            out = args.json_dir / f"{path.stem}.json" if args.json_dir is not None else None
            alerts, wall = play(scenario, out, reuse=False)
        report = evaluate(scenario, alerts)
        for note in tally.add(scenario.name, scenario, alerts, report):
            print(f"  {note}")
        print(f"{scenario.name}: {len(alerts)} alerts, {report.recall:.2f} recall{wall}", flush=True)
    print("\n" + "\n".join(tally.rows()))
    print(
        f"\n{tally.totals()}; P1/P2 on healthy scenarios: {len(tally.healthy_p1p2)} {tally.healthy_p1p2}; "
        f"flapping: {len(tally.flaps)} {tally.flaps}"
    )


if __name__ == "__main__":
    main()
