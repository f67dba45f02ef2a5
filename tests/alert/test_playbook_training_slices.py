"""The training checks of playbooks (``first_stopped_rank``, ``training_trend``) read a job's
records a slice of time at a time: the same answers as one read of the whole window, with a
fraction of the Python heap (a ``training_stalled`` playbook on a 128-rank job held ~73 MiB of
records at once, and the interpreter kept the arenas of that burst in a serving hub)."""

from __future__ import annotations

import math
import statistics
import tracemalloc
from typing import Any

import pytest

from gpuscope.alert.checks import CHECKS, CheckResult, Context, _finite
from gpuscope.alert.training_reads import SLICE_RECORDS, training_slices
from gpuscope.model import Alert, Batch, TrainingRecord
from gpuscope.store.duckdb import DuckDBStore

T = 1_796_132_400.0
MIB = 2**20


def stalled(job: str, now: float) -> Alert:
    return Alert("al-1", "training_stalled", "P1", "ml", {"job": job}, now, f"{job} stalled", 40.0)


def fill(
    store: DuckDBStore, job: str, ranks: int, seconds: float, every: float, stops: dict[int, float]
) -> None:
    """``ranks`` ranks of ``job`` each reporting every ``every`` s for ``seconds`` before ``T``
    (rank ``r`` not after ``stops[r]``); ranks of one node (4 ranks) report at the same instant,
    so ranks tie on their times; every 7th loss is NaN."""
    n = int(seconds / every)
    batch: list[TrainingRecord] = []
    for k in range(n):
        ts = T - seconds + k * every
        for rank in range(ranks):
            if ts > stops.get(rank, math.inf):
                continue
            loss = math.nan if (k + rank) % 7 == 0 else 2.0 - k / n + rank * 1e-3
            metrics = {"step_seconds": every * (1.0 + (k % 5) * 0.01 + rank * 1e-4), "loss": loss}
            batch.append(
                TrainingRecord(ts + (rank % 4 == 3) * 0.25, job, rank, k, metrics, {"node": f"n{rank // 4}"})
            )
        if len(batch) >= 20_000:
            store.append(Batch("sdk", training=batch))
            batch = []
    store.append(Batch("sdk", training=batch))


def old_first_stopped_rank(ctx: Context) -> CheckResult:
    """The check before slices: one read of the whole window."""
    job = ctx.alert.entity["job"]
    records = ctx.store.training(job, ctx.now - ctx.lookback, ctx.now, None, 100_000)
    last: dict[int, tuple[float, int]] = {}
    for rec in records:
        last[rec.rank] = (rec.ts, rec.step)
    if len(last) < 2:
        return CheckResult("unknown", f"too few ranks of job {job} reported recently")
    rank, (ts, step) = min(last.items(), key=lambda kv: kv[1][0])
    newest = max(t for t, _ in last.values())
    if newest - ts < 2.0:
        return CheckResult("clear", f"all {len(last)} ranks stopped together (at step {step})")
    return CheckResult(
        "found",
        f"rank {rank} stopped first, at step {step}, {newest - ts:.0f} s before the others",
        {"rank": rank, "step": step, "last_ts": ts},
    )


def old_training_trend(ctx: Context) -> CheckResult:
    job = ctx.alert.entity["job"]
    records = ctx.store.training(job, ctx.now - 6 * ctx.lookback, ctx.now, None, 50_000)
    if not records:
        return CheckResult("unknown", f"no training records of job {job}")
    cut = ctx.now - ctx.lookback / 5
    out: dict[str, Any] = {"last_step": max(r.step for r in records)}
    for metric in ("step_seconds", "loss"):
        before = [v for r in records if r.ts < cut and (v := _finite(r.metrics.get(metric))) is not None]
        recent = [v for r in records if r.ts >= cut and (v := _finite(r.metrics.get(metric))) is not None]
        if before and recent:
            out[metric] = {"before": statistics.median(before), "recent": statistics.median(recent)}
    parts = [f"{m} {v['before']:.3g} -> {v['recent']:.3g}" for m, v in out.items() if isinstance(v, dict)]
    text = f"last step {out['last_step']}" + (f"; {', '.join(parts)} (median before/recent)" if parts else "")
    return CheckResult("found", text, out)


@pytest.fixture(scope="module")
def store() -> Any:
    s = DuckDBStore(":memory:", durable=False)
    # job-a: 8 ranks over 40 minutes, rank 5 stops 40 s early, ranks 6 and 7 together 12 s early
    fill(s, "job-a", 8, 2400.0, 1.0, {5: T - 40.0, 6: T - 12.0, 7: T - 12.0})
    # job-b: every rank stops at the same instant (a hang): ties everywhere
    fill(s, "job-b", 8, 900.0, 1.0, {r: T - 100.0 for r in range(8)})
    yield s
    s.close()


@pytest.mark.parametrize(
    ("start", "end", "limit"),
    [
        (T - 600, T, 100_000),
        (T - 2400, T, 50_000),
        (T - 2400, T, 7_777),
        (T - 2400, T, 5),
        (T - 95.25, T - 20.25, 333),
    ],
)
def test_slices_read_exactly_the_records_of_one_read(
    store: DuckDBStore, start: float, end: float, limit: int
) -> None:
    whole = store.training("job-a", start, end, None, limit)
    slices = list(training_slices(store, "job-a", start, end, limit))
    joined = [r for part in reversed(slices) for r in part]
    # repr: NaN losses compare unequal to themselves
    assert [repr(r) for r in joined] == [repr(r) for r in whole]
    assert max(len(part) for part in slices) < 3 * SLICE_RECORDS


@pytest.mark.parametrize("job", ["job-a", "job-b"])
@pytest.mark.parametrize("now", [T, T - 20.0, T - 700.0])
@pytest.mark.parametrize("lookback", [600.0, 45.0])
def test_the_training_checks_answer_as_one_read_did(
    store: DuckDBStore, job: str, now: float, lookback: float
) -> None:
    ctx = Context(stalled(job, now), store, now, [], lookback)
    assert CHECKS["first_stopped_rank"](ctx) == old_first_stopped_rank(ctx)
    assert CHECKS["training_trend"](ctx) == old_training_trend(ctx)


def test_the_rank_that_stopped_first_is_named(store: DuckDBStore) -> None:
    found = CHECKS["first_stopped_rank"](Context(stalled("job-a", T), store, T, []))
    assert found.status == "found" and found.data["rank"] == 5
    hang = CHECKS["first_stopped_rank"](Context(stalled("job-b", T), store, T, []))
    assert hang.status == "clear" and hang.text.startswith("all 8 ranks stopped together")


def test_a_stalled_playbook_on_a_128_rank_job_holds_a_slice_not_the_window() -> None:
    """The load generator's jobs: 128 ranks, ~85 records a second; 10 minutes are 51,200 records.
    Read at once they held ~73 MiB of Python objects at the check's peak."""
    s = DuckDBStore(":memory:", durable=False)
    try:
        fill(s, "big", 128, 600.0, 1.5, {})
        ctx = Context(stalled("big", T), s, T, [])
        expected = old_first_stopped_rank(ctx)
        tracemalloc.start()
        try:
            answer = CHECKS["first_stopped_rank"](ctx)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert answer == expected
        assert peak < 12 * MIB, f"the check held {peak / MIB:.1f} MiB at its peak"
    finally:
        s.close()
