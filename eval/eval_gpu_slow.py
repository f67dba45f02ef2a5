"""Small GPU slowdowns against realistic clock noise, for ``gpu_underperforming``.

A job of 16 GPUs of one model (two nodes of eight) reports its SM clocks every second through the
detection and alert engines (``ClockDetector`` alone). The clocks carry the noise real parts show
under load without a throttle reason, all of it drawn per seed:

* a **part offset** per GPU: sustained clocks of one model differ by ``part`` (sigma, clipped at
  2.5 sigma) for the life of the part;
* a **job-wide wander** (AR(1), 1.5 %, 2-minute memory): the workload's phases move every GPU's
  clock together;
* a **per-GPU wander** (AR(1), ``wander`` sigma, 5-minute memory): temperature and boost bins;
* **reading noise** (``read`` sigma), the clock quantised to 15 MHz, 2 % of readings one bin low;
* **power blips**: now and then a GPU's power cap engages for 1-3 s (with its throttle reason).

Shapes per seed (one hour each; faults from 1200 s for 900 s):

* ``healthy``: one speed; ``two-speed-3`` / ``two-speed-6``: GPUs 8-15 run 3 % / 6 % slower for
  the whole run (two stable speeds of one model: clock limits or a slower bin);
* ``one-F``: GPU 3 slows down F times (F in 1.03, 1.05, 1.08, 1.10); ``two-speed-one-F``: GPU 12
  of the 6 %-slower group slows down F times;
* ``many-F``: GPUs 0-5 slow down F times at once (F in 1.05, 1.08).

Scoring (``eval/episodes.py``): a fault is found when a ``gpu_underperforming`` alert of its GPU
starts between its start and 60 s after its end (TTD from the start); any other alert is false (all
are P2, so a false alert on a healthy shape is a P2 on a healthy hour); "most" is the most alerts
one fault raised.

The **oracle** is a bound for any detector that judges a 5-minute window: it knows each GPU's part
offset exactly and takes the median of the healthy peers' offset-free log clocks as reference; its
bar is the deepest 5-minute mean any healthy GPU reached in the healthy shapes of the same noise
(so zero false alerts there), and a fault counts as found when a 5-minute window inside it passes.

usage: python eval/eval_gpu_slow.py [--seeds 1,2,3] [--noise low,mid,high] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np
from episodes import Tally, tally

from gpuscope.alert.engine import AlertEngine
from gpuscope.detect.clocks import METRICS, ClockDetector
from gpuscope.detect.engine import DetectionEngine
from gpuscope.model import Batch, Frame

RULE = "gpu_underperforming"
NODES, PER_NODE = 2, 8
G = NODES * PER_NODE
DURATION = 3600
FAULT_AT, FAULT_FOR = 1200, 900
GRACE = 60.0
BASE_MHZ, MAX_MHZ, BIN = 1830.0, 1980.0, 15.0
WINDOW = 300
NOISE = {  # part offset, per-GPU wander, reading noise (sigmas)
    "low": (0.01, 0.002, 0.003),
    "mid": (0.01, 0.004, 0.005),
    "high": (0.02, 0.008, 0.01),
}
Fault = tuple[list[int], float]  # GPUs, factor


@dataclass(slots=True)
class Shape:
    name: str
    faults: list[Fault] = field(default_factory=list)
    slow_group: float = 1.0  # GPUs 8-15 run this many times slower for the whole run

    @property
    def healthy(self) -> bool:
        return not self.faults


def shapes() -> list[Shape]:
    out = [Shape("healthy"), Shape("two-speed-3", slow_group=1.03), Shape("two-speed-6", slow_group=1.06)]
    for f in (1.03, 1.05, 1.08, 1.10):
        out.append(Shape(f"one-{f:.2f}", [([3], f)]))
        out.append(Shape(f"two-speed-one-{f:.2f}", [([12], f)], slow_group=1.06))
    for f in (1.05, 1.08):
        out.append(Shape(f"many-{f:.2f}", [(list(range(6)), f)]))
    return out


def _ar1(rng: np.random.Generator, n: int, cols: int, sigma: float, tau: float) -> np.ndarray:
    phi = math.exp(-1.0 / tau)
    z = rng.standard_normal((n, cols)) * sigma * math.sqrt(1.0 - phi * phi)
    out = np.empty((n, cols))
    out[0] = rng.standard_normal(cols) * sigma
    for t in range(1, n):
        out[t] = phi * out[t - 1] + z[t]
    return out


@dataclass(slots=True)
class Clocks:
    mhz: np.ndarray  # [t, gpu], reported
    capped: np.ndarray  # [t, gpu], the power cap engaged (reason set)
    true_log: np.ndarray  # [t, gpu], log clock without the part offset and the slow group (oracle)
    slowed: np.ndarray  # [t, gpu], a fault is in force


def clocks(shape: Shape, noise: str, seed: int) -> Clocks:
    part_s, wander_s, read_s = NOISE[noise]
    rng = np.random.default_rng([seed, G])
    part = np.clip(rng.normal(0.0, part_s, G), -2.5 * part_s, 2.5 * part_s)
    group = np.where(np.arange(G) >= PER_NODE, -math.log(shape.slow_group), 0.0)
    common = _ar1(rng, DURATION, 1, 0.015, 120.0)
    own = _ar1(rng, DURATION, G, wander_s, 300.0)
    read = rng.standard_normal((DURATION, G)) * read_s
    slow = np.zeros((DURATION, G))
    slowed = np.zeros((DURATION, G), bool)
    for gpus, factor in shape.faults:
        slow[FAULT_AT : FAULT_AT + FAULT_FOR, gpus] -= math.log(factor)
        slowed[FAULT_AT : FAULT_AT + FAULT_FOR, gpus] = True
    blip = np.zeros((DURATION, G), bool)
    starts = np.argwhere(rng.random((DURATION, G)) < 0.002)
    for t, g in starts.tolist():
        blip[t : t + int(rng.integers(1, 4)), g] = True
    log_clock = math.log(BASE_MHZ) + part + group + common + own + read + slow
    log_clock = np.where(blip, log_clock + math.log(0.985), log_clock)
    mhz = np.minimum(np.round(np.exp(log_clock) / BIN) * BIN, MAX_MHZ)
    mhz = np.where(rng.random((DURATION, G)) < 0.02, mhz - BIN, mhz)
    return Clocks(mhz, blip, np.log(mhz) - part - group, slowed)


def _batches(t: int, c: Clocks) -> list[Batch]:
    out = []
    for n in range(NODES):
        node = f"node-{n}"
        rows, entities = [], []
        for g in range(PER_NODE):
            i = n * PER_NODE + g
            cap = bool(c.capped[t, i])
            reading = {
                "gpu_utilization_percent": 96.0,
                "gpu_sm_clock_mhz": float(c.mhz[t, i]),
                "gpu_clock_event_reasons": 4.0 if cap else 0.0,
                "gpu_throttle_sw_power": float(cap),
                "gpu_power_watts": 600.0,
                "gpu_power_limit_watts": 700.0,
            }
            rows.append([reading.get(m, 0.0) for m in METRICS])
            entities.append({"node": node, "gpu": str(g), "uuid": f"GPU-{node}-{g}", "job": "llm"})
        out.append(Batch(source=node, frames=[Frame(float(t), list(METRICS), entities, np.array(rows))]))
    return out


def play(c: Clocks, duration: int, every: int = 1) -> AlertEngine:
    """The clocks' first ``duration`` seconds through ``ClockDetector`` and the alert engine, one
    evaluation every ``every`` seconds (on that second's reading, as a hub evaluating that often)."""
    detection = DetectionEngine([ClockDetector()])
    alerting = AlertEngine(resolve_after=5.0)
    for t in range(0, duration, every):
        detection.observe_many(_batches(t, c))
        alerting.update(float(t), detection.evaluate(float(t)))
    return alerting


def run(shape: Shape, noise: str, seed: int) -> Tally:
    alerting = play(clocks(shape, noise, seed), DURATION)
    starts = [
        (int(a.entity["node"].split("-")[1]) * PER_NODE + int(a.entity["gpu"]), a.started_at)
        for a in alerting.all()
        if a.rule == RULE
    ]
    faulty = sorted({g for gpus, _ in shape.faults for g in gpus})
    return tally(starts, [(g, FAULT_AT, FAULT_AT + FAULT_FOR) for g in faulty], GRACE)


def _window_means(x: np.ndarray) -> np.ndarray:
    csum = np.cumsum(np.vstack([np.zeros((1, x.shape[1])), x]), axis=0)
    return (csum[WINDOW:] - csum[:-WINDOW]) / WINDOW


def oracle_devs(c: Clocks) -> tuple[np.ndarray, np.ndarray]:
    """Per 5-minute window and GPU, the mean log clock against the healthy peers' median."""
    peers = np.where(c.slowed, np.nan, c.true_log)
    ref = np.nanmedian(peers, axis=1, keepdims=True)
    dev = _window_means(c.true_log - ref)
    inside = _window_means(c.slowed.astype(float)) >= 1.0
    return dev, inside


def _row(name: str, found: str, alerts: object, false: object, most: object, ttd: str, oracle: str) -> str:
    return f"{name:24} {found:>7} {alerts:>6} {false:>5} {most:>4} {ttd:>14} {oracle:>7}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--noise", default="low,mid,high")
    p.add_argument("--only", nargs="*", default=[])
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    picked = [s for s in shapes() if not args.only or any(o in s.name for o in args.only)]
    for noise in args.noise.split(","):
        part, wander, read = NOISE[noise]
        print(f"noise {noise}: part {part:.1%}, wander {wander:.1%}, read {read:.1%}")
        print(_row("shape", "found", "alerts", "false", "most", "TTD p50/max s", "oracle"))
        bar = -math.inf
        for seed in seeds:  # the oracle's bar: the deepest healthy 5-minute mean in the healthy shapes
            for s in shapes():
                if s.healthy:
                    dev, _ = oracle_devs(clocks(s, noise, seed))
                    bar = max(bar, float(-dev.min()))
        total = Tally()
        for shape in picked:
            agg, hits = Tally(), 0
            for seed in seeds:
                agg.add(run(shape, noise, seed))
                dev, inside = oracle_devs(clocks(shape, noise, seed))
                hits += int(((-dev > bar) & inside).any(axis=0).sum())
            ttd = f"{np.median(agg.ttd):.0f}/{max(agg.ttd):.0f}" if agg.ttd else "-"
            oracle = f"{hits}/{agg.episodes}" if agg.episodes else "-"
            found = f"{agg.found}/{agg.episodes}" if agg.episodes else "-"
            print(_row(shape.name, found, agg.alerts, agg.false, agg.most, ttd, oracle))
            total.add(agg)
        true_alerts = total.alerts - total.false
        recall = total.found / total.episodes if total.episodes else float("nan")
        precision = true_alerts / total.alerts if total.alerts else float("nan")
        print(
            f"all: recall {recall:.2f} ({total.found}/{total.episodes}), precision {precision:.2f} "
            f"({true_alerts}/{total.alerts}), oracle bar {bar:.2%} below the reference\n"
        )


if __name__ == "__main__":
    main()
