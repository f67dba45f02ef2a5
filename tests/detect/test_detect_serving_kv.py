"""KV-cache pressure is judged against the service's own operating point."""

from __future__ import annotations

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.detect.serving import ServingDetector
from gpuscope.model import Finding


def serve(
    kv: list[tuple[float, float, float]], hours: float, seed: int = 1
) -> list[tuple[float, list[Finding]]]:
    """A service sampled every 5 s; ``kv`` lists (from_second, usage, preemptions per minute)."""
    rng = np.random.default_rng(seed)
    detector = ServingDetector()
    out = []
    for k in range(int(hours * 3600 / 5)):
        ts = 5.0 * k
        usage, per_min = next((u, p) for t, u, p in reversed(kv) if ts >= t)
        snap = Snapshot(
            ts=ts,
            requests=30.0,
            errors=0.0,
            p95=0.4 * float(np.exp(0.04 * rng.standard_normal())),
            p99=0.6,
            ttft=0.1 * float(np.exp(0.05 * rng.standard_normal())),
            queue=float(rng.poisson(2.0)),
            kv=min(1.0, usage + 0.01 * float(rng.standard_normal())),
            preempted=float(rng.poisson(per_min * 5.0 / 60.0)),
            model="chat",
            version="v1",
            nodes=["node-0"],
        )
        out.append((ts, detector.judge(ts, {"chat": snap})))
    return out


def kv_alerts(run: list[tuple[float, list[Finding]]]) -> list[float]:
    """Onsets of kv_cache_pressure findings."""
    onsets, was = [], False
    for ts, findings in run:
        now = any(f.rule == "kv_cache_pressure" for f in findings)
        if now and not was:
            onsets.append(ts)
        was = now
    return onsets


def test_a_service_always_near_full_with_a_few_preemptions_raises_nothing_for_hours() -> None:
    for seed in range(3):
        assert kv_alerts(serve([(0.0, 0.90, 5.0)], hours=4.0, seed=seed)) == []


def test_pressure_beyond_the_operating_point_fires_once() -> None:
    run = serve([(0.0, 0.90, 5.0), (3600.0, 0.985, 60.0), (4200.0, 0.90, 5.0)], hours=2.0)
    assert [t for t in kv_alerts(run)] and 3600.0 <= kv_alerts(run)[0] <= 3720.0
    assert len(kv_alerts(run)) == 1


def test_a_quiet_service_whose_cache_jumps_fires() -> None:
    run = serve([(0.0, 0.45, 0.0), (1800.0, 0.97, 40.0)], hours=1.0)
    assert len(kv_alerts(run)) == 1 and 1800.0 <= kv_alerts(run)[0] <= 1900.0
