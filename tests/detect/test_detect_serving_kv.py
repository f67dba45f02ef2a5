"""KV-cache pressure is judged against the service's own operating point, and is P2 only when
latency or time to first token moves with it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuscope.detect.services import Snapshot
from gpuscope.model import Finding
from support import chat_snapshot, judge_chat, onsets_of


def serve(
    kv: list[tuple[float, float, float]],
    hours: float,
    seed: int = 1,
    slower: tuple[float, float, float] | None = None,
) -> list[tuple[float, list[Finding]]]:
    """A service sampled every 5 s; ``kv`` lists (from_second, usage, preemptions per minute);
    ``slower`` (from, to, factor) multiplies p95 latency and TTFT (preempted requests recomputed)."""
    rng = np.random.default_rng(seed)

    def snapshot(ts: float) -> Snapshot:
        usage, per_min = next((u, p) for t, u, p in reversed(kv) if ts >= t)
        factor = slower[2] if slower is not None and slower[0] <= ts < slower[1] else 1.0
        snap = chat_snapshot(ts, rng, latency=factor, ttft=factor)
        kv_usage = min(1.0, usage + 0.01 * float(rng.standard_normal()))
        return replace(snap, kv=kv_usage, preempted=float(rng.poisson(per_min * 5.0 / 60.0)))

    return judge_chat((5.0 * k for k in range(int(hours * 3600 / 5))), snapshot)


def kv_alerts(run: list[tuple[float, list[Finding]]]) -> list[float]:
    """Onsets of kv_cache_pressure findings."""
    return onsets_of(run, "kv_cache_pressure")


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


def kv_severities(run: list[tuple[float, list[Finding]]]) -> set[str | None]:
    return {f.severity for _, findings in run for f in findings if f.rule == "kv_cache_pressure"}


def test_pressure_that_users_do_not_feel_stays_below_p2() -> None:
    run = serve([(0.0, 0.90, 5.0), (3600.0, 0.985, 60.0), (4200.0, 0.90, 5.0)], hours=2.0)
    assert kv_alerts(run) and kv_severities(run) == {None}  # the rule's own tier: P3


def test_pressure_that_moves_time_to_first_token_is_p2() -> None:
    slower = (3620.0, 4200.0, 1.8)  # preempted requests are recomputed: TTFT and the tail grow
    run = serve([(0.0, 0.90, 5.0), (3600.0, 0.985, 60.0), (4200.0, 0.90, 5.0)], hours=2.0, slower=slower)
    assert len(kv_alerts(run)) == 1 and "P2" in kv_severities(run)
