"""Per-worker mini-batch traces shaped like the real logs (Alibaba PAI, cluster-trace-gpu-v2020) and
what :class:`~gpuscope.detect.ranks.RankDetector` flags on them, for the straggler tests."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.ranks import RankDetector
from gpuscope.model import TrainingRecord

EVERY = 10.0  # seconds between samples


def trace(
    levels: list[float], samples: int, seed: int = 1, noise: float | np.ndarray = 0.025, repeat: float = 0.4
) -> np.ndarray:
    """samples x workers of mini-batch times around ``levels`` (``noise``: per reading, one for all
    workers or one per worker); a share ``repeat`` of the readings repeat the previous one (40 %, as
    in the real logs)."""
    rng = np.random.default_rng(seed)
    out = np.array(levels) * (1.0 + noise * rng.standard_normal((samples, len(levels))))
    for k in range(1, samples):
        same = rng.random(len(levels)) < repeat
        out[k, same] = out[k - 1, same]
    return out


def flags(times: np.ndarray, every: float = EVERY) -> list[set[int]]:
    """The ranks flagged ``training_straggler`` after each sample (fed as each worker's own step
    time), one sample every ``every`` seconds."""
    detector = RankDetector()
    out: list[set[int]] = []
    for k, row in enumerate(times):
        ts = k * every
        for rank, seconds in enumerate(row.tolist()):
            labels = {"node": f"worker-{rank}", "gpu": "0"}
            detector.on_training(TrainingRecord(ts, "j", rank, k, {"step_seconds": seconds}, labels))
        detector.on_training(TrainingRecord(ts + 0.1 * every, "j", 0, k + 1, {}))  # opens the next step
        found = detector.evaluate(ts + 0.2 * every)
        out.append({int(f.entity["rank"]) for f in found if f.rule == "training_straggler"})
    return out


def report_step(detector: RankDetector, k: int, compute: np.ndarray) -> None:
    """Step ``k`` at ts = k of a job whose ranks computed for ``compute`` seconds: every rank (4 a
    node) reports the step's time (the slowest rank's compute + 0.15 s of collective) and its arrival
    lag at the collective; rank 0 opens the next step half a second later."""
    step = float(compute.max()) + 0.15
    skew = compute - compute.min()
    for r in range(len(compute)):
        metrics = {"step_seconds": step, "collective_arrival_skew_seconds": float(skew[r])}
        detector.on_training(
            TrainingRecord(float(k), "j", r, k, metrics, {"node": f"n{r // 4}", "gpu": str(r % 4)})
        )
    detector.on_training(TrainingRecord(k + 0.5, "j", 0, k + 1, {}))
