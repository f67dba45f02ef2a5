"""Which tier (raw, 1m, 1h) serves which part of a query range."""

from __future__ import annotations

from gpuscope.store.duckdb.planner import Tier, plan

M, H = 60_000, 3_600_000
RAW = Tier("raw", 0, None, None)


def names(segments: list[tuple[Tier, int, int]]) -> list[tuple[str, int, int]]:
    return [(t.name, a, b) for t, a, b in segments]


def test_raw_only_when_no_rollups() -> None:
    assert names(plan(5, 10 * H, H, [RAW])) == [("raw", 5, 10 * H)]


def test_fine_step_reads_raw_even_when_rollups_exist() -> None:
    tiers = [RAW, Tier("1m", M, None, 5 * H)]
    assert names(plan(0, 2 * H, 1_000, tiers)) == [("raw", 0, 2 * H)]


def test_coarse_step_reads_rollups_up_to_their_watermark_then_raw() -> None:
    tiers = [RAW, Tier("1m", M, None, 90 * M + 30_000), Tier("1h", H, None, H)]
    assert names(plan(0, 2 * H, 10 * M, tiers)) == [("1m", 0, 90 * M), ("raw", 90 * M, 2 * H)]
    assert names(plan(0, 2 * H, H, tiers)) == [("1h", 0, H), ("1m", H, 90 * M), ("raw", 90 * M, 2 * H)]


def test_rollups_serve_only_whole_buckets_inside_the_range() -> None:
    tiers = [RAW, Tier("1m", M, None, 10 * H)]
    assert names(plan(30_000, 5 * M + 10_000, M, tiers)) == [
        ("raw", 30_000, M),
        ("1m", M, 5 * M),
        ("raw", 5 * M, 5 * M + 10_000),
    ]


def test_deleted_raw_rows_fall_back_to_coarser_rollups() -> None:
    tiers = [Tier("raw", 0, 2 * H, None), Tier("1m", M, H, 3 * H), Tier("1h", H, None, 3 * H)]
    assert names(plan(0, 4 * H, 1_000, tiers)) == [("1h", 0, H), ("1m", H, 2 * H), ("raw", 2 * H, 4 * H)]


def test_gaps_with_no_tier_are_skipped() -> None:
    tiers = [Tier("raw", 0, 2 * H + 5, None), Tier("1m", M, None, H)]
    assert names(plan(0, 3 * H, 1_000, tiers)) == [("1m", 0, H), ("raw", 2 * H + 5, 3 * H)]
