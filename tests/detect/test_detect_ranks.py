"""Stragglers against a robust peer reference: many slow ranks at once, small slowdowns, a
straggler that gets worse, and healthy jobs with fixed per-rank offsets and data-loader hiccups."""

from __future__ import annotations

import numpy as np

from detect.rank_traces import report_step
from gpuscope.detect.ranks import RankDetector
from gpuscope.detect.vectors import speed_groups
from gpuscope.model import Finding, TrainingRecord

STEP = 1.0
WORLD = 8


def run(
    slow: dict[int, list[tuple[int, float]]],
    steps: int = 400,
    seed: int = 3,
    placement: dict[int, float] | None = None,
    world: int = WORLD,
) -> list[list[Finding]]:
    """Feed a synchronous job: rank r computes ``0.85 * factor`` of a step, ``slow[r]`` lists
    (from_step, factor) changes, ``placement[r]`` a factor from the first step (a slower GPU
    model); each rank reports how late it arrived at the collective."""
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(0.95, 1.05, world)  # fixed per-GPU speed differences
    for rank, f in (placement or {}).items():
        offsets[rank] *= f
    detector = RankDetector()
    out: list[list[Finding]] = []
    for k in range(steps):
        factor = np.ones(world)
        for rank, changes in slow.items():
            for start, f in changes:
                if k >= start:
                    factor[rank] = f
        compute = 0.85 * STEP * offsets * factor * (1.0 - np.abs(0.012 * rng.standard_normal(world)))
        if rng.random() < 0.02:  # a data-loader hiccup
            compute[int(rng.integers(world))] += rng.uniform(0.3, 1.2)
        skew = compute - compute.min()
        step_seconds = float(compute.max()) + 0.15
        ts = float(k) * STEP
        for r in range(world):
            metrics = {"step_seconds": step_seconds, "collective_arrival_skew_seconds": float(skew[r])}
            detector.on_training(
                TrainingRecord(ts, "j", r, k, metrics, {"node": f"n{r // 4}", "gpu": str(r % 4)})
            )
        detector.on_training(TrainingRecord(ts + 0.5, "j", 0, k + 1, {}))  # opens the next step
        out.append(detector.evaluate(ts + 0.6))
    return out


def flagged(findings: list[list[Finding]], since: int = 0) -> set[int]:
    return {int(f.entity["rank"]) for fs in findings[since:] for f in fs if f.rule == "training_straggler"}


def test_healthy_job_with_offsets_and_hiccups_raises_nothing() -> None:
    for seed in range(5):
        assert flagged(run({}, seed=seed)) == set()


def test_a_straggler_in_a_two_rank_job_is_named_and_a_healthy_one_stays_quiet() -> None:
    # two ranks have no peer median: the late one at each collective, confirmed by the job's own
    # step time (a straggler sets the pace of a synchronous job)
    for seed in range(3):
        assert flagged(run({}, seed=seed, world=2)) == set()
    for rank in (0, 1):
        findings = run({rank: [(150, 1.3)]}, world=2)
        assert flagged(findings) == {rank}
        first = min(k for k, fs in enumerate(findings) if fs)
        assert 150 <= first <= 170


def test_a_rank_of_a_two_rank_job_whose_peer_got_faster_is_no_straggler() -> None:
    # it now arrives last at every collective, but the job's steps did not get longer
    assert flagged(run({1: [(150, 0.75)]}, world=2)) == set()


def test_five_of_eight_ranks_slowing_together_are_all_flagged() -> None:
    slow = {r: [(150, 1.3)] for r in range(5)}
    findings = run(slow)
    assert flagged(findings) == set(range(5))
    first = min(k for k, fs in enumerate(findings) if fs)
    assert 150 <= first <= 165


def test_a_ten_percent_straggler_is_flagged_and_stays_flagged() -> None:
    findings = run({6: [(150, 1.1)]})
    assert flagged(findings) == {6}
    assert all(any(f.entity["rank"] == "6" for f in fs) for fs in findings[170:])


def test_a_worsening_straggler_moves_its_value() -> None:
    findings = run({2: [(150, 1.3), (250, 4.0)]})
    value = [next(f.value for f in fs if f.entity["rank"] == "2") for fs in findings[200:240]]
    worse = [next(f.value for f in fs if f.entity["rank"] == "2") for fs in findings[300:340]]
    assert worse[-1] is not None and value[-1] is not None
    assert worse[-1] > 2.5 * value[-1]  # a share of the (now longer) step: 0.25 -> 0.7


TWO_SPEEDS = {r: 1.3 for r in range(4, 8)}  # the ranks of node n1 are 30 % slower from the start


def rules(findings: list[list[Finding]], rule: str) -> list[Finding]:
    return [f for fs in findings for f in fs if f.rule == rule]


def test_a_job_at_two_speeds_is_one_slow_placement_and_no_straggler() -> None:
    for seed in range(3):
        findings = run({}, seed=seed, placement=TWO_SPEEDS)
        assert flagged(findings) == set()
        placed = rules(findings, "slow_placement")
        assert placed, seed
        assert {f.key for f in placed} == {("slow_placement", (("job", "j"),))}  # one alert
        last = placed[-1]
        assert last.details["slow_ranks"] == [4, 5, 6, 7] and last.details["slow_nodes"] == ["n1"]
        # the GPUs they run on: a slow GPU's own alert there joins this one's incident, however late
        assert last.details["links"] == [{"node": "n1", "gpu": str(g)} for g in range(4)]
        assert last.affected_gpus == WORLD and last.at_risk is not None
        assert 0.15 <= last.at_risk <= 0.3  # about 0.3 * 0.85 of a step lost per 1.1 s step
        assert "4-7" in last.summary and "n1" in last.summary


def test_two_slow_ranks_slowing_further_inside_the_slow_group_are_flagged() -> None:
    findings = run({5: [(200, 4.0)], 6: [(200, 4.0)]}, placement=TWO_SPEEDS)
    assert flagged(findings) == {5, 6}
    assert flagged(findings[:200]) == set()
    late = [f for f in rules(findings, "training_straggler") if f.entity["rank"] == "5"][-1]
    assert late.details["speed_group"] == 1 and "speed group 1" in late.summary


def test_a_slowdown_among_the_fast_ranks_is_flagged() -> None:
    findings = run({1: [(200, 1.2)]}, placement=TWO_SPEEDS)
    assert flagged(findings) == {1}
    first = min(k for k, fs in enumerate(findings) if any(f.rule == "training_straggler" for f in fs))
    assert 200 <= first <= 220


def test_one_speed_jobs_have_no_slow_placement() -> None:
    for seed in range(5):
        assert not rules(run({}, seed=seed), "slow_placement")
    assert not rules(run({2: [(150, 1.3), (250, 4.0)]}), "slow_placement")


def test_speed_groups_need_a_wide_gap_and_two_ranks_a_side() -> None:
    paces = {0: 0.0, 1: 0.02, 2: 0.03, 3: 0.3, 4: 0.32}
    assert speed_groups(paces, 0.1) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1}
    assert set(speed_groups({**paces, 3: 0.04}, 0.1).values()) == {0}  # a lone slow rank is no group
    assert set(speed_groups(paces, 0.5).values()) == {0}


def test_slow_placement_from_own_step_times_costs_the_share_of_the_slow_step() -> None:
    rng = np.random.default_rng(5)
    detector = RankDetector()
    out: list[Finding] = []
    for k in range(60):  # no collective timing: each rank reports its own step time
        for r in range(WORLD):
            own = (1.25 if r >= 6 else 1.0) * (1.0 + 0.01 * float(rng.standard_normal()))
            detector.on_training(TrainingRecord(float(k), "j", r, k, {"step_seconds": own}))
        detector.on_training(TrainingRecord(k + 0.5, "j", 0, k + 1, {}))
        out = detector.evaluate(k + 0.6)
    placed = [f for f in out if f.rule == "slow_placement"]
    assert len(placed) == 1 and placed[0].details["slow_ranks"] == [6, 7]
    assert placed[0].at_risk is not None and abs(placed[0].at_risk - 0.2) < 0.02  # (1.25 - 1) / 1.25
    assert not [f for f in out if f.rule == "training_straggler"]


def elastic(steps: int, grow_at: int, slow: dict[int, int], seed: int = 5) -> list[list[Finding]]:
    """A job of 8 ranks that grows to 16 at ``grow_at`` onto parts 1.3x slower (elastic scale-up);
    ``slow[r]`` is the step rank r slows down 1.3x (a live fault)."""
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([rng.uniform(0.97, 1.03, 8), 1.3 * rng.uniform(0.97, 1.03, 8)])
    detector = RankDetector()
    out: list[list[Finding]] = []
    for k in range(steps):
        world = 16 if k >= grow_at else 8
        factor = np.array([1.3 if r in slow and k >= slow[r] else 1.0 for r in range(world)])
        compute = 0.85 * offsets[:world] * factor * (1.0 - np.abs(0.01 * rng.standard_normal(world)))
        report_step(detector, k, compute)
        out.append(detector.evaluate(k + 0.6))
    return out


def test_ranks_joining_on_slower_parts_form_their_own_group_and_a_live_straggler_stays_flagged() -> None:
    findings = elastic(400, grow_at=150, slow={2: 80})
    assert 2 in flagged(findings[100:150])
    assert flagged(findings[200:]) == {2}  # the new ranks are a placement, rank 2 is still a fault
    assert all(
        any(f.entity["rank"] == "2" for f in fs if f.rule == "training_straggler") for fs in findings[100:]
    )
    placement = [f for f in findings[-1] if f.rule == "slow_placement"]
    assert placement and placement[0].details["slow_ranks"] == list(range(8, 16))


def test_a_two_rank_job_that_grows_is_judged_by_its_peers_from_then_on() -> None:
    # the reference is chosen per job from its ranks: two have no peer median, four do; once the
    # job has grown, a straggler is named by its peers, without the two-rank job's step-time check
    rng = np.random.default_rng(11)
    offsets = rng.uniform(0.97, 1.03, 4)
    detector = RankDetector()
    out: list[list[Finding]] = []
    for k in range(320):
        world = 4 if k >= 60 else 2
        factor = np.array([1.3 if r == 3 and k >= 220 else 1.0 for r in range(world)])
        compute = 0.85 * offsets[:world] * factor * (1.0 - np.abs(0.01 * rng.standard_normal(world)))
        report_step(detector, k, compute)
        out.append(detector.evaluate(k + 0.6))
    assert flagged(out[:220]) == set()
    assert flagged(out[220:]) == {3}
    assert 220 <= min(k for k, fs in enumerate(out) if fs) <= 240
